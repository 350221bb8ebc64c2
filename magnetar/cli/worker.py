"""`magnetar worker start` and `magnetar standalone`: run workers in the foreground."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from magnetar.broker import BrokerError, EmbeddedBroker, find_free_port, port_is_free
from magnetar.exceptions import MagnetarError
from magnetar.worker.cluster_key import create_cluster_key_file
from magnetar.worker.config import WorkerConfig, load_worker_config, take_secret_environment
from magnetar.worker.service import WorkerService

__all__ = ["standalone", "worker"]

BROKER_PORT = 6650
"""The embedded broker's port when it is free (the one the README's examples use)."""
HTTP_PORT = 8080
"""The first worker's REST port when it is free (the CLI's default --admin-url)."""
_HOST = "127.0.0.1"


def _configure_logging(level: str) -> None:
    numeric = getattr(logging, level.upper())
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if numeric > logging.DEBUG:
        # httpx logs every request at INFO, and workers ask each other twice a second
        logging.getLogger("httpx").setLevel(logging.WARNING)


def pick_port(preferred: int, host: str = _HOST) -> int:
    """``preferred`` if nothing listens there, else a free port."""
    return preferred if port_is_free(host, preferred) else find_free_port(host)


def _run_until_signal(services: list[WorkerService]) -> None:
    """Block until Ctrl-C / SIGTERM, then stop the workers gracefully."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        click.echo("Stopping: finishing in-flight messages...", err=True)
        _stop_all(services)


def _stop_all(services: list[WorkerService]) -> None:
    """Stop the workers at once, each bounded by its shutdown timeout: one after another, the
    instances the first ones hand over would start on the others and be stopped again."""
    stoppers = [
        threading.Thread(target=service.stop, name=f"stop-{service.config.worker_id}")
        for service in services
    ]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join()


def _run_then_exit(run: Callable[[], None]) -> NoReturn:
    """Run a command, then end the process without finalizing the interpreter: the Pulsar
    client library's threads may log into Python while it finalizes, which aborts the
    process (see ``magnetar.client``)."""
    code = 0
    try:
        run()
    except click.ClickException as error:
        error.show()
        code = error.exit_code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start(config: WorkerConfig) -> WorkerService:
    try:
        return WorkerService(config).start()
    except (MagnetarError, OSError) as error:
        raise click.ClickException(f"worker {config.worker_id} cannot start: {error}") from None


@click.group()
def worker() -> None:
    """Run a Magnetar worker."""


@worker.command("start")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML worker config; MAGNETAR_* variables and flags override it.",
)
@click.option("--worker-id", help="Unique id of this worker [default: host-pid].")
@click.option("--http-host", help="Address of the REST API [default: 127.0.0.1].")
@click.option("--http-port", type=int, help="Port of the REST API [default: 8080].")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Package cache directory.")
@click.option("--runtime", type=click.Choice(["process", "thread"]))
@click.option("--scheduler", type=click.Choice(["least-loaded-sticky", "round-robin"]))
@click.option(
    "--pulsar-admin-url",
    help="HTTP admin URL of the Apache Pulsar broker (http://broker:8080): the worker then "
    "creates the system namespace with retention, compacts the system topics and "
    "deduplicates EFFECTIVELY_ONCE outputs [default: none, nothing is asked of the broker].",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_obj
def start_worker(obj: Any, /, config_file: str | None, log_level: str, **flags: Any) -> None:
    """Start a worker that joins the cluster on --broker-url; runs until Ctrl-C.

    \b
    Example:
      magnetar --broker-url pulsar://localhost:6650 worker start --worker-id w1 \\
          --http-port 8080 --data-dir /var/lib/magnetar/w1
    """
    _configure_logging(log_level)
    try:
        config = load_worker_config(
            Path(config_file) if config_file else None, broker_url=obj.broker_url, **flags
        )
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    take_secret_environment()  # read: no instance inherits them
    _run_then_exit(lambda: _serve_until_signal(config))


@worker.command("upgrade-state")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="The workers' YAML config (its system namespace and metadata topic).",
)
@click.pass_obj
def upgrade_state(obj: Any, /, config_file: str | None) -> None:
    """Carry function state over from Magnetar 0.1.0's journal names: run once, with every
    worker stopped, before starting the upgraded workers.

    \b
    0.1.0 named a journal state-<tenant>-<namespace>-<name> unescaped, so functions such
    as a/b-c and a-b/c shared one. A function with '-' (or another character but letters,
    digits, '_' and '.') in its names has a journal of its own now; this copies its old
    journal into it. An old journal two functions shared is left alone and reported.
    """
    try:
        config = load_worker_config(
            Path(config_file) if config_file else None, broker_url=obj.broker_url
        )
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    _run_then_exit(lambda: _upgrade_state(config))


def _upgrade_state(config: WorkerConfig) -> None:
    from magnetar.client import create_client
    from magnetar.statestore.upgrade import carry_over_journals
    from magnetar.worker.metadata import MetadataManager

    client = create_client(config.broker_url, connection=config.broker_connection)
    try:
        metadata = MetadataManager(client, config.system_topic(config.metadata_topic))
        metadata.start()
        try:
            if not metadata.wait_caught_up(config.request_timeout_s * 6):
                raise click.ClickException(
                    f"could not read the metadata topic on {config.broker_url} in time"
                )
            functions = list(metadata.functions())
        finally:
            metadata.stop()
        report = carry_over_journals(client, functions, config.system_namespace)
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    finally:
        client.close()
    for fqfn, count in report.copied.items():
        click.echo(f"{fqfn}: carried over {count} journal messages")
    for fqfn in report.kept:
        click.echo(f"{fqfn}: its journal has records already; left as it is")
    for old, fqfns in report.ambiguous.items():
        click.echo(
            f"{old} was shared by {', '.join(fqfns)}: not carried over (whose records are "
            "whose cannot be told); their state starts empty"
        )
    click.echo(f"{len(functions)} functions checked, {len(report.copied)} carried over")


def _serve_until_signal(config: WorkerConfig) -> None:
    service = _start(config)
    click.echo(
        f"Worker {config.worker_id} serving {config.admin_url} "
        f"(broker {config.broker_url}); Ctrl-C to stop",
        err=True,
    )
    _run_until_signal([service])


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML settings every worker shares (e.g. authentication); MAGNETAR_* variables apply too.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Broker data and package caches [default: a temporary directory].",
)
@click.option(
    "--broker-port",
    type=int,
    help=f"Port of the embedded broker [default: {BROKER_PORT}, or a free one if it is taken].",
)
@click.option(
    "--http-port",
    type=int,
    help=f"REST port of the first worker; the others use the next ports [default: {HTTP_PORT}, "
    "or free ones where taken].",
)
@click.option("--workers", type=click.IntRange(1, 16), default=1, show_default=True)
@click.option(
    "--runtime", type=click.Choice(["process", "thread"]), default="process", show_default=True
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def standalone(
    config_file: str | None,
    data_dir: str | None,
    broker_port: int | None,
    http_port: int | None,
    workers: int,
    runtime: str,
    log_level: str,
) -> None:
    """The embedded broker and N workers, in the foreground until Ctrl-C.

    \b
    Example:
      magnetar standalone --workers 3     # REST APIs on ports 8080, 8081, 8082
    """
    _configure_logging(log_level)
    _run_then_exit(
        lambda: _run_standalone(config_file, data_dir, broker_port, http_port, workers, runtime)
    )


def _run_standalone(
    config_file: str | None,
    data_dir: str | None,
    broker_port: int | None,
    http_port: int | None,
    workers: int,
    runtime: str,
) -> None:
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="magnetar-"))
    try:
        broker = _start_broker(root / "broker", broker_port)
        try:
            _run_workers(broker, root, config_file, http_port, workers, runtime)
        finally:
            broker.stop()
    except BrokerError as error:
        raise click.ClickException(str(error)) from None
    finally:
        if not data_dir:
            shutil.rmtree(root, ignore_errors=True)


def _run_workers(
    broker: EmbeddedBroker,
    root: Path,
    config_file: str | None,
    http_port: int | None,
    workers: int,
    runtime: str,
) -> None:
    """Start the standalone workers on ``broker``; run them until Ctrl-C.

    They share a cluster key, created once in ``root`` (unless the settings give one)."""
    services: list[WorkerService] = []
    cluster_key = create_cluster_key_file(root / "cluster.key")
    # Taken out of the environment, which instances inherit, and given to every worker as
    # the environment would (over the file).
    secret_settings = take_secret_environment()
    try:
        for index in range(workers):
            worker_id = f"worker-{index + 1}"
            config = _standalone_config(
                config_file,
                {"cluster_key": cluster_key},
                **secret_settings,
                worker_id=worker_id,
                broker_url=broker.service_url,
                http_port=_worker_port(worker_id, http_port, index),
                data_dir=root / worker_id,
                runtime=runtime,
            )
            services.append(_start(config))
            click.echo(f"{worker_id}: {config.admin_url}", err=True)
        click.echo(
            f"Magnetar standalone: broker {broker.service_url}, {workers} "
            f"worker{'s' if workers > 1 else ''}, REST API {services[0].config.admin_url}; "
            "Ctrl-C to stop",
            err=True,
        )
    except BaseException:
        for service in services:
            service.stop(drain=False)
        raise
    _run_until_signal(services)


def _start_broker(data_dir: Path, port: int | None) -> EmbeddedBroker:
    """The embedded broker, started: on ``port``, or by default on 6650 where free and else
    on a free port (saying which)."""
    if port is not None:
        return EmbeddedBroker(data_dir, host=_HOST, port=port).start()
    if port_is_free(_HOST, BROKER_PORT):
        try:
            return EmbeddedBroker(data_dir, host=_HOST, port=BROKER_PORT).start()
        except BrokerError:
            pass  # taken in the meantime
    broker = EmbeddedBroker(data_dir, host=_HOST).start()
    click.echo(
        f"Port {BROKER_PORT} is taken, so the broker listens on {broker.service_url}: "
        f"give commands --broker-url {broker.service_url} (or set MAGNETAR_BROKER_URL)",
        err=True,
    )
    return broker


def _worker_port(worker_id: str, first: int | None, index: int) -> int:
    """The REST port of the ``index``-th standalone worker: the one after the first's, as
    asked or, by default, from 8080 on where free (saying so where not)."""
    if first is not None:
        return first + index
    preferred = HTTP_PORT + index
    port = pick_port(preferred)
    if port != preferred:
        url = f"http://{_HOST}:{port}"
        hint = (
            f": give commands --admin-url {url} (or set MAGNETAR_ADMIN_URL)" if index == 0 else ""
        )
        click.echo(
            f"Port {preferred} is taken, so {worker_id}'s REST API is at {url}{hint}", err=True
        )
    return port


def _standalone_config(
    config_file: str | None, defaults: dict[str, Any], **flags: Any
) -> WorkerConfig:
    """One standalone worker's config: ``defaults``, the shared file and environment, then
    its own flags."""
    try:
        return load_worker_config(Path(config_file) if config_file else None, defaults, **flags)
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
