"""`magnetar functions ...`: the `pulsar-admin functions` commands.

``localrun`` runs here; the commands that manage functions on a cluster are in
``function_admin`` and the state commands in ``state``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from magnetar.cli.function_admin import register_admin_commands
from magnetar.cli.function_flags import (
    config_from_flags,
    function_config_options,
    with_default_name,
)
from magnetar.cli.render import emit_json, table
from magnetar.cli.state import putstate, querystate
from magnetar.exceptions import MagnetarError

if TYPE_CHECKING:  # localrun's imports wait for localrun: the admin commands need none
    from magnetar.instance.metrics import MetricsSnapshot

__all__ = ["functions"]


@click.group()
def functions() -> None:
    """Manage and run functions (like `pulsar-admin functions`)."""


register_admin_commands(functions)
functions.add_command(querystate)
functions.add_command(putstate)


@functions.command()
@click.option("--tenant", help="Tenant of the function [default: public].")
@click.option("--namespace", help="Namespace of the function [default: default].")
@click.option("--name", help="Name of the function [default: the class name].")
@function_config_options
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Data directory of the embedded broker (without --broker-url).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="Where the instances keep their state databases [default: beside the embedded "
    "broker's data, .magnetar/state with --broker-url].",
)
@click.option(
    "--status-interval",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between progress reports.",
)
@click.pass_obj
def localrun(
    obj: Any,
    /,
    function_config_file: str | None,
    data_dir: str | None,
    state_dir: str | None,
    status_interval: float,
    **flags: Any,
) -> None:
    """Run a function locally until Ctrl-C; starts an embedded broker unless --broker-url.

    \b
    Example:
      magnetar functions localrun --py examples/exclamation.py \\
          --classname exclamation.ExclamationFunction --inputs in --output out
    """
    from magnetar.instance.localrun import LocalRun

    try:
        config = with_default_name(config_from_flags(function_config_file, **flags))
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    json_output = obj.output == "json"
    with (
        _broker(obj.broker_url, data_dir) as broker_url,
        _state_dir(state_dir, obj.broker_url, data_dir) as state_path,
    ):
        run = LocalRun(
            config,
            broker_url,
            on_metrics=_Progress(json_output),
            report_interval_s=status_interval,
            state_dir=state_path,
        )
        try:
            run.check()
        except MagnetarError as error:
            raise click.ClickException(str(error)) from None
        click.echo(
            f"Running {config.fqfn} ({config.parallelism} instance"
            f"{'s' if config.parallelism > 1 else ''}) on {broker_url}; "
            "Ctrl-C to stop (twice to kill)",
            err=True,
        )
        previous = {
            sig: signal.signal(sig, lambda *_: run.stop())
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            code = run.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        _final(run.snapshots, json_output)
        for instance_id, failure in sorted(run.errors.items()):
            click.echo(f"instance {instance_id} failed: {failure}", err=True)
    if code:
        raise SystemExit(code)


@contextlib.contextmanager
def _state_dir(
    state_dir: str | None, broker_url: str | None, data_dir: str | None
) -> Iterator[Path]:
    """The state databases' directory: beside the embedded broker's data (a temporary
    broker's state goes with it), .magnetar/state for a broker of its own."""
    if state_dir:
        yield Path(state_dir)
    elif broker_url:
        yield Path(".magnetar/state")
    elif data_dir:
        yield Path(data_dir) / "magnetar-state"
    else:
        directory = Path(tempfile.mkdtemp(prefix="magnetar-state-"))
        try:
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _broker(broker_url: str | None, data_dir: str | None) -> Iterator[str]:
    if broker_url:
        yield broker_url
        return
    from magnetar.broker import BrokerError, EmbeddedBroker

    directory = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="magnetar-broker-"))
    try:
        with EmbeddedBroker(directory) as broker:
            click.echo(
                f"Started the embedded broker at {broker.service_url} (data in {directory})",
                err=True,
            )
            yield broker.service_url
    except BrokerError as error:
        raise click.ClickException(str(error)) from None
    finally:
        if not data_dir:
            shutil.rmtree(directory, ignore_errors=True)


_HEADERS = (
    "instance",
    "running",
    "received",
    "processed",
    "user exc",
    "system exc",
    "avg µs",
    "p99 µs",
)


def _rows(snapshots: dict[int, MetricsSnapshot]) -> list[tuple[Any, ...]]:
    return [
        (
            s.instance_id,
            "yes" if s.running else "no",
            s.received,
            s.processed,
            s.user_exceptions,
            s.system_exceptions,
            s.average_latency_ms * 1000,
            s.p99_latency_ms * 1000,
        )
        for _, s in sorted(snapshots.items())
    ]


class _Progress:
    """Prints the instances' metrics when they have changed since the last report."""

    def __init__(self, json_output: bool) -> None:
        self._json_output = json_output
        self._last: list[tuple[Any, ...]] = []

    def __call__(self, snapshots: dict[int, MetricsSnapshot]) -> None:
        rows = _rows(snapshots)
        if rows and rows != self._last:
            self._last = rows
            _progress(snapshots, self._json_output)


def _progress(snapshots: dict[int, MetricsSnapshot], json_output: bool) -> None:
    if json_output:
        emit_json({"instances": [s.status() for _, s in sorted(snapshots.items())]}, err=True)
    else:
        click.echo(table(_HEADERS, _rows(snapshots)) + "\n", err=True)


def _final(snapshots: dict[int, MetricsSnapshot], json_output: bool) -> None:
    if json_output:
        emit_json({"instances": [s.status() for _, s in sorted(snapshots.items())]})
    elif snapshots:
        click.echo(table(_HEADERS, _rows(snapshots)))
