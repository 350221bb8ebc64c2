"""The `magnetar` command: global options and the command groups."""

from __future__ import annotations

import click

from magnetar.cli.context import CliContext
from magnetar.cli.interrupts import STOP
from magnetar.cli.lazy import LazyGroup

__all__ = ["CliContext", "main"]

_COMMANDS = {
    "functions": "magnetar.cli.functions:functions",
    "functions-worker": "magnetar.cli.functions_worker:functions_worker",
    "tokens": "magnetar.cli.tokens:tokens",
    "topics": "magnetar.cli.topics:topics",
    "spark": "magnetar.cli.spark:spark",
    "tenants": "magnetar.cli.tenancy:tenants",
    "namespaces": "magnetar.cli.tenancy:namespaces",
    "worker": "magnetar.cli.worker:worker",
    "standalone": "magnetar.cli.worker:standalone",
}


@click.group(
    cls=LazyGroup,
    lazy_commands=_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
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
    if STOP.requested:  # Ctrl-C while the command line loaded: nothing began, nothing to do
        ctx.exit(0)
    if ctx.invoked_subcommand != "functions":
        STOP.release()  # as click does; `functions` decides for localrun
    ctx.obj = CliContext(admin_url, broker_url, auth_token, output_format)
