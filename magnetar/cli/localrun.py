"""`magnetar functions localrun`: a function's instances on this machine, with the flags of
`pulsar-admin functions localrun` (and their deprecated spellings).

Ctrl-C (or SIGTERM) at any moment stops it cleanly and exits 0: before the instances run it
abandons the start; once they run, they finish their in-flight messages first. Asked twice,
the instances are killed.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from magnetar.cli.admin import fqfn_options, resolve_fqfn
from magnetar.cli.function_flags import config_from_flags, function_config_options
from magnetar.cli.interrupts import STOP
from magnetar.cli.render import emit_json, table
from magnetar.exceptions import MagnetarError

if TYPE_CHECKING:
    from magnetar.cli.app import CliContext
    from magnetar.client import Connection
    from magnetar.instance.config import FunctionConfig
    from magnetar.instance.localrun import LocalRun
    from magnetar.instance.metrics import MetricsSnapshot

__all__ = ["localrun"]

_NOT_USED = {
    "web_service_url": "--web-service-url: a Python function has no admin client to give it",
    "state_storage_service_url": "--state-storage-service-url: state is kept by Magnetar "
    "itself (a journal topic and RocksDB, see --state-dir), with no state storage service",
    "metrics_port_start": "--metrics-port-start: instances serve no metrics port; the "
    "progress table (or --output json) reports their metrics",
}
_IDENTITY = ("tenant", "namespace", "name")
_HEADERS = (
    "instance",
    "running",
    "received",
    "processed",
    "user exc",
    "system exc",
    "dead letters",
    "avg µs",
    "p99 µs",
)


def _localrun_options(command: Any) -> Any:
    options = [
        click.option(
            "--broker-service-url",
            "--brokerServiceUrl",
            help="Pulsar service URL [default: the global --broker-url, else an embedded broker].",
        ),
        click.option(
            "--web-service-url", help="Accepted; not used (Python functions get no admin)."
        ),
        click.option(
            "--state-storage-service-url",
            "--stateStorageServiceUrl",
            help="Accepted; not used (state needs no service: see --state-dir).",
        ),
        click.option(
            "--client-auth-plugin",
            "--clientAuthPlugin",
            help="Authentication plugin of the client, e.g. "
            "org.apache.pulsar.client.impl.auth.AuthenticationToken.",
        ),
        click.option("--client-auth-params", "--clientAuthParams", help="The plugin's parameters."),
        click.option("--use-tls", "--use_tls", is_flag=True, help="Connect with TLS."),
        click.option(
            "--tls-allow-insecure",
            "--tls_allow_insecure",
            is_flag=True,
            help="Accept an untrusted TLS certificate.",
        ),
        click.option(
            "--hostname-verification-enabled",
            "--hostname_verification_enabled",
            is_flag=True,
            help="Check the broker's TLS host name.",
        ),
        click.option(
            "--tls-trust-cert-path", "--tls_trust_cert_path", help="Trusted TLS certificates."
        ),
        click.option(
            "--instance-id-offset",
            "--instanceIdOffset",
            type=click.IntRange(min=0),
            default=0,
            help="The first instance's id [default: 0].",
        ),
        click.option(
            "--runtime",
            type=click.Choice(["PROCESS", "THREAD"], case_sensitive=False),
            help="Accepted (Pulsar's Java option): every instance runs in a process.",
        ),
        click.option(
            "--secrets-provider-classname",
            help="secretsprovider.ClearTextSecretsProvider (the default), "
            "secretsprovider.EnvironmentBasedSecretsProvider, or module.Class of your own.",
        ),
        click.option(
            "--secrets-provider-config", help="JSON given to the secrets provider's init."
        ),
        click.option("--metrics-port-start", help="Accepted; not used (no metrics port)."),
        click.option(
            "--data-dir",
            type=click.Path(file_okay=False),
            help="Data directory of the embedded broker (without a broker URL).",
        ),
        click.option(
            "--state-dir",
            type=click.Path(file_okay=False),
            help="Where the instances keep their state databases [default: beside the "
            "embedded broker's data, .magnetar/state with a broker URL].",
        ),
        click.option(
            "--status-interval",
            type=float,
            default=5.0,
            show_default=True,
            help="Seconds between progress reports.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command()
@fqfn_options
@function_config_options
@_localrun_options
@click.pass_obj
def localrun(
    obj: CliContext,
    /,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    function_config_file: str | None,
    broker_service_url: str | None,
    client_auth_plugin: str | None,
    client_auth_params: str | None,
    use_tls: bool,
    tls_allow_insecure: bool,
    hostname_verification_enabled: bool,
    tls_trust_cert_path: str | None,
    instance_id_offset: int,
    runtime: str | None,
    secrets_provider_classname: str | None,
    secrets_provider_config: str | None,
    data_dir: str | None,
    state_dir: str | None,
    status_interval: float,
    **flags: Any,
) -> None:
    """Run a function locally until Ctrl-C; starts an embedded broker unless a broker URL is
    given (--broker-service-url or the global --broker-url).

    \b
    Example:
      magnetar functions localrun --py examples/exclamation.py \\
          --classname exclamation.ExclamationFunction --inputs in --output out
    """
    try:
        _stop_point()
        from magnetar.client import Connection  # pulsar loads only when a command needs it

        code = _start(
            obj,
            _config(tenant, namespace, name, fqfn, function_config_file, flags),
            broker_service_url or obj.broker_url,
            LocalRunSettings(
                Connection(
                    client_auth_plugin,
                    client_auth_params,
                    use_tls,
                    tls_allow_insecure,
                    hostname_verification_enabled,
                    tls_trust_cert_path,
                ),
                (
                    secrets_provider_classname,
                    _json(secrets_provider_config, "--secrets-provider-config"),
                ),
                instance_id_offset,
                data_dir,
                state_dir,
                status_interval,
            ),
        )
    except _StartAbandonedError:  # nothing to finish
        click.echo("Stopped before the function started", err=True)
        return
    if code:
        raise SystemExit(code)


@dataclass(frozen=True)
class LocalRunSettings:
    """The localrun flags beyond the function's config."""

    connection: Connection
    secrets_provider: tuple[str | None, Any]
    instance_id_offset: int
    data_dir: str | None
    state_dir: str | None
    status_interval: float


def _start(
    obj: CliContext, config: FunctionConfig, broker_url: str | None, settings: LocalRunSettings
) -> int:
    """Start the broker (without a URL), check the code, run; the exit code."""
    from magnetar.instance.localrun import LocalRun

    json_output = obj.output == "json"
    with (
        _broker(broker_url, settings.data_dir) as service_url,
        _state_dir(settings.state_dir, broker_url, settings.data_dir) as state_path,
    ):
        _stop_point()
        run = LocalRun(
            config,
            service_url,
            on_metrics=_Progress(json_output),
            report_interval_s=settings.status_interval,
            state_dir=state_path,
            connection=settings.connection,
            secrets_provider=settings.secrets_provider,
            instance_id_offset=settings.instance_id_offset,
        )
        try:
            run.check()
        except MagnetarError as error:
            raise click.ClickException(str(error)) from None
        _stop_point()
        return _run(run, config, service_url, json_output)


def _config(
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    function_config_file: str | None,
    flags: dict[str, Any],
) -> FunctionConfig:
    from magnetar.cli.function_flags import with_default_name

    for flag, note in _NOT_USED.items():
        if flags.pop(flag, None) is not None:
            click.echo(f"note: {note}; accepted and not used", err=True)

    given: tuple[str | None, ...] = (tenant, namespace, name)
    if fqfn:
        given = tuple(resolve_fqfn(tenant, namespace, name, fqfn).split("/"))
    identity = {key: value for key, value in zip(_IDENTITY, given, strict=True) if value}
    try:
        return with_default_name(config_from_flags(function_config_file, **flags, **identity))
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None


def _run(run: LocalRun, config: FunctionConfig, service_url: str, json_output: bool) -> int:
    """Run the instances, stopping them gracefully on SIGINT/SIGTERM; the exit code."""
    click.echo(
        f"Running {config.fqfn} ({config.parallelism} instance"
        f"{'s' if config.parallelism > 1 else ''}) on {service_url}; "
        "Ctrl-C to stop (twice to kill)",
        err=True,
    )
    STOP.listen(run.stop)  # a request from now on stops the instances (twice: kills them)
    try:
        code = run.run()
    finally:
        STOP.listen(None)
    _final(run.snapshots, json_output)
    for instance_id, failure in sorted(run.errors.items()):
        click.echo(f"instance {instance_id} failed: {failure}", err=True)
    return code


class _StartAbandonedError(Exception):
    """Ctrl-C (or SIGTERM) came before the instances ran."""


def _stop_point() -> None:
    """Where a start may end: before the broker, before the code is checked, before the
    instances start."""
    if STOP.requested:
        raise _StartAbandonedError


def _json(value: str | None, flag: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"{flag} must be JSON: {error}") from None


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


def _rows(snapshots: dict[int, MetricsSnapshot]) -> list[tuple[Any, ...]]:
    return [
        (
            s.instance_id,
            "yes" if s.running else "no",
            s.received,
            s.processed,
            s.user_exceptions,
            s.system_exceptions,
            s.dead_lettered,
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
