"""`magnetar functions ...`: the `pulsar-admin functions` commands.

``localrun`` runs here; the cluster commands (create, update, status, ...) arrive with the
REST API.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from pydantic.alias_generators import to_camel

from magnetar.broker import BrokerError, EmbeddedBroker
from magnetar.cli.render import emit_json, table
from magnetar.exceptions import MagnetarError
from magnetar.instance.config import FunctionConfig, load_config_file
from magnetar.instance.localrun import LocalRun
from magnetar.instance.metrics import MetricsSnapshot

__all__ = ["functions"]


@click.group()
def functions() -> None:
    """Manage and run functions (like `pulsar-admin functions`)."""


def _json_option(value: str | None, flag: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"{flag} must be JSON: {error}") from None


def _bool_option(value: str | None, flag: str) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise click.BadParameter(f"{flag} takes true or false, not {value!r}")
    return lowered == "true"


def config_from_flags(function_config_file: str | None, **flags: Any) -> FunctionConfig:
    """The FunctionConfig from a config file overlaid with the flags that were given."""
    data: dict[str, Any] = load_config_file(function_config_file) if function_config_file else {}
    inputs = flags.pop("inputs")
    if inputs:
        data["inputs"] = [t.strip() for t in inputs.split(",") if t.strip()]
    json_flags = {
        "user_config": "--user-config",
        "secrets": "--secrets",
        "custom_serde_inputs": "--custom-serde-inputs",
    }
    for field, flag in json_flags.items():
        value = _json_option(flags.pop(field), flag)
        if value is not None:
            data[to_camel(field)] = value
    auto_ack = _bool_option(flags.pop("auto_ack"), "--auto-ack")
    if auto_ack is not None:
        data["autoAck"] = auto_ack
    for field, value in flags.items():
        if value is not None and value is not False:
            data[to_camel(field)] = value
    if data.get("py"):
        data["py"] = str(Path(data["py"]).expanduser().resolve())
    return FunctionConfig.parse(data)


def _with_default_name(config: FunctionConfig) -> FunctionConfig:
    if config.name:
        return config
    if config.class_name:
        name = config.class_name.rsplit(".", 1)[-1]
    elif config.py:
        name = Path(config.py).stem
    else:
        raise click.UsageError("pass --name, --classname or --py")
    return config.model_copy(update={"name": name})


@functions.command()
@click.option(
    "--function-config-file",
    type=click.Path(dir_okay=False),
    help="JSON or YAML FunctionConfig; flags override its fields.",
)
@click.option("--tenant", help="Tenant of the function [default: public].")
@click.option("--namespace", help="Namespace of the function [default: default].")
@click.option("--name", help="Name of the function [default: the class name].")
@click.option("--py", type=click.Path(), help="The function's .py file or .zip package.")
@click.option("--classname", "class_name", help="module.ClassName or module.function.")
@click.option("-i", "--inputs", help="Comma-separated input topics.")
@click.option("--topics-pattern", help="Regex of input topics.")
@click.option("-o", "--output", help="Output topic.")
@click.option("--log-topic", help="Topic the function's logs are published to.")
@click.option("--parallelism", type=int, help="Number of instances [default: 1].")
@click.option(
    "--processing-guarantees",
    type=click.Choice(["ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL"]),
    help="Delivery semantics [default: ATLEAST_ONCE].",
)
@click.option("--user-config", help="JSON map readable with context.get_user_config_value.")
@click.option("--secrets", help="JSON map of secret name to locator.")
@click.option("--subs-name", "sub_name", help="Subscription name [default: the FQFN].")
@click.option(
    "--subs-position",
    "subscription_position",
    type=click.Choice(["Latest", "Earliest"]),
    help="Where a new subscription starts [default: Latest].",
)
@click.option("--retain-ordering", is_flag=True, default=None, help="Process in order.")
@click.option(
    "--retain-key-ordering", is_flag=True, default=None, help="Process each key in order."
)
@click.option("--max-message-retries", type=int, help="Redeliveries before dead-lettering.")
@click.option("--dead-letter-topic", help="Topic for messages that exhaust their retries.")
@click.option("--timeout-ms", type=int, help="Upper bound of one invocation, in ms.")
@click.option("--auto-ack", help="true or false [default: true].")
@click.option("--custom-serde-inputs", help="JSON map of input topic to SerDe class.")
@click.option(
    "--output-serde-classname", "output_serde_class_name", help="SerDe class for the output."
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Data directory of the embedded broker (without --broker-url).",
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
    status_interval: float,
    **flags: Any,
) -> None:
    """Run a function locally until Ctrl-C; starts an embedded broker unless --broker-url."""
    try:
        config = _with_default_name(config_from_flags(function_config_file, **flags))
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    json_output = obj.output == "json"
    with _broker(obj.broker_url, data_dir) as broker_url:
        run = LocalRun(
            config, broker_url, on_metrics=_Progress(json_output), report_interval_s=status_interval
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
def _broker(broker_url: str | None, data_dir: str | None) -> Iterator[str]:
    if broker_url:
        yield broker_url
        return
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
