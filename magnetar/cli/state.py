"""`magnetar functions querystate|putstate`: a function's state, over the REST API.

Like `pulsar-admin functions querystate --key K [--watch]` and `putstate --state JSON`, with
Pulsar's FunctionState JSON (``key``, ``stringValue``, ``byteValue`` in base64,
``numberValue``, ``version``).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click

from magnetar.cli.admin import AdminError, admin_client, fqfn_options, resolve_fqfn
from magnetar.cli.render import emit_json, table

if TYPE_CHECKING:
    from magnetar.cli.context import CliContext

__all__ = ["putstate", "querystate"]


def _path(fqfn: str, key: str) -> str:
    return f"/admin/v3/functions/{fqfn}/state/{quote(key, safe='')}"


def _render(obj: CliContext, state: dict[str, Any]) -> None:
    if obj.output == "json":
        emit_json(state)
        return
    if state.get("numberValue") is not None:
        kind, value = "counter", state["numberValue"]
    elif state.get("stringValue") is not None:
        kind, value = "string", state["stringValue"]
    else:
        kind, value = "bytes (base64)", state.get("byteValue")
    click.echo(
        table(("key", "type", "value", "version"), [(state["key"], kind, value, state["version"])])
    )


@click.command()
@fqfn_options
@click.option("--key", "-k", required=True, help="The state key to read.")
@click.option(
    "--watch", "-w", is_flag=True, help="Keep reading, and print the state when it changes."
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between reads with --watch.",
)
@click.pass_obj
def querystate(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    key: str,
    watch: bool,
    interval: float,
) -> None:
    """Show the value or counter a function keeps under a key (Pulsar's FunctionState).

    \b
    Examples:
      magnetar functions querystate --name word_count --key pulsar
      magnetar functions querystate --name word_count --key pulsar --watch
    """
    client = admin_client(obj)
    path = _path(resolve_fqfn(tenant, namespace, name, fqfn), key)
    if not watch:
        _render(obj, client.get_json(path))
        return
    last: Any = None
    try:
        while True:
            try:
                state: Any = client.get_json(path)
            except AdminError as error:
                if error.status_code != 404:
                    raise
                state = str(error)
            if state != last:
                if isinstance(state, str):
                    click.echo(state, err=True)
                else:
                    _render(obj, state)
                last = state
            time.sleep(interval)
    except KeyboardInterrupt:
        return


@click.command()
@fqfn_options
@click.option(
    "--state",
    "-s",
    "state_json",
    required=True,
    help='FunctionState JSON: {"key": K, and one of "stringValue", "byteValue" (base64), '
    '"numberValue" (sets a counter)}.',
)
@click.pass_obj
def putstate(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    state_json: str,
) -> None:
    """Store a value (or set a counter) in a function's state.

    \b
    Example:
      magnetar functions putstate --name word_count --state '{"key": "note", "stringValue": "hi"}'
    """
    try:
        state = json.loads(state_json)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not valid JSON: {error}", param_hint="'--state'") from None
    if not isinstance(state, dict) or not isinstance(state.get("key"), str) or not state["key"]:
        raise click.BadParameter(
            'must be a JSON object with a "key", e.g. {"key": "k", "stringValue": "v"}',
            param_hint="'--state'",
        )
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    admin_client(obj).request(
        "POST", _path(target, state["key"]), files={"state": (None, state_json)}
    )
    if obj.output == "json":
        emit_json({"fqfn": target, "key": state["key"]})
    else:
        click.echo(f"Put state key {state['key']!r} of {target} successfully")
