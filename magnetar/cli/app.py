"""The `magnetar` command: global options and the command groups."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import click

from magnetar.cli.functions import functions
from magnetar.cli.functions_worker import functions_worker
from magnetar.cli.spark import spark
from magnetar.cli.tenancy import namespaces, tenants
from magnetar.cli.tokens import tokens
from magnetar.cli.topics import topics
from magnetar.cli.worker import standalone, worker

__all__ = ["CliContext", "main"]


@dataclass(frozen=True)
class CliContext:
    """Global options every command can read through ``click.get_current_context().obj``."""

    admin_url: str
    """The worker's REST admin URL."""
    broker_url: str | None
    """The Pulsar service URL; None where a command may start the embedded broker."""
    auth_token: str | None
    """Bearer token sent to the admin API (a JWT when the worker checks tokens)."""
    output: str
    """``table`` for people, ``json`` for programs."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--admin-url",
    envvar="MAGNETAR_ADMIN_URL",
    default="http://127.0.0.1:8080",
    show_default=True,
    help="REST admin URL of a Magnetar worker.",
)
@click.option(
    "--broker-url",
    envvar="MAGNETAR_BROKER_URL",
    default=None,
    help="Pulsar service URL, e.g. pulsar://localhost:6650.",
)
@click.option(
    "--auth-token",
    envvar="MAGNETAR_AUTH_TOKEN",
    default=None,
    help="Bearer token for the admin API, when the worker requires one.",
)
@click.option(
    "--output",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output for people or for programs.",
)
@click.version_option(package_name="magnetar")
@click.pass_context
def main(
    ctx: click.Context,
    admin_url: str,
    broker_url: str | None,
    auth_token: str | None,
    output_format: str,
) -> None:
    """Magnetar: run Apache Pulsar Functions from Python."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # see magnetar.cli
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ctx.obj = CliContext(admin_url, broker_url, auth_token, output_format)


main.add_command(functions)
main.add_command(functions_worker)
main.add_command(tokens)
main.add_command(topics)
main.add_command(spark)
main.add_command(tenants)
main.add_command(namespaces)
main.add_command(worker)
main.add_command(standalone)
