"""`magnetar functions timers`: a function's pending timers, over the REST API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from magnetar.cli.admin import admin_client, fqfn_options, resolve_fqfn
from magnetar.cli.render import emit_json, table

if TYPE_CHECKING:
    from magnetar.cli.context import CliContext

__all__ = ["timers"]


def _when(due_ms: int) -> str:
    return datetime.fromtimestamp(due_ms / 1000, UTC).isoformat(timespec="milliseconds")


@click.command()
@fqfn_options
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="List at most this many (the soonest).",
)
@click.pass_obj
def timers(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    limit: int,
) -> None:
    """List a function's pending timers, soonest first.

    \b
    Example:
      magnetar functions timers --name reminders
    """
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    pending: list[dict[str, Any]] = admin_client(obj).get_json(
        f"/admin/v3/functions/{target}/timers?limit={limit}"
    )
    if obj.output == "json":
        emit_json(pending)
        return
    rows = [(t["reference"], _when(t["due"]), t["callback"], t["payload"]) for t in pending]
    click.echo(table(("reference", "due (UTC)", "callback", "payload"), rows))
