"""`magnetar worker start` and `magnetar standalone`: run workers in the foreground."""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

import click

from magnetar.broker import BrokerError, EmbeddedBroker
from magnetar.exceptions import MagnetarError
from magnetar.worker.config import WorkerConfig, load_worker_config
from magnetar.worker.service import WorkerService

__all__ = ["standalone", "worker"]


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


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
        for service in reversed(services):
            service.stop(drain=True)


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
@click.option("--broker-port", type=int, help="Port of the embedded broker [default: free].")
@click.option(
    "--http-port",
    type=int,
    default=8080,
    show_default=True,
    help="REST port of the first worker; the others use the next ports.",
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
    http_port: int,
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
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="magnetar-"))
    try:
        with EmbeddedBroker(root / "broker", port=broker_port) as broker:
            services: list[WorkerService] = []
            try:
                for index in range(workers):
                    config = _standalone_config(
                        config_file,
                        worker_id=f"worker-{index + 1}",
                        broker_url=broker.service_url,
                        http_port=http_port + index,
                        data_dir=root / f"worker-{index + 1}",
                        runtime=runtime,
                    )
                    services.append(_start(config))
                    click.echo(f"worker-{index + 1}: {config.admin_url}", err=True)
                click.echo(
                    f"Magnetar standalone: broker {broker.service_url}, {workers} "
                    f"worker{'s' if workers > 1 else ''}; Ctrl-C to stop",
                    err=True,
                )
            except BaseException:
                for service in services:
                    service.stop(drain=False)
                raise
            _run_until_signal(services)
    except BrokerError as error:
        raise click.ClickException(str(error)) from None
    finally:
        if not data_dir:
            shutil.rmtree(root, ignore_errors=True)


def _standalone_config(config_file: str | None, **flags: Any) -> WorkerConfig:
    """One standalone worker's config: the shared file and environment, then its own flags."""
    try:
        return load_worker_config(Path(config_file) if config_file else None, **flags)
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
