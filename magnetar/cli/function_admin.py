"""`magnetar functions create|update|delete|get|list|status|stats|trigger|start|stop|restart`:
the `pulsar-admin functions` commands that manage functions on a cluster, over its REST API.

Every command takes the function's identity as ``--tenant/--namespace/--name`` or ``--fqfn``,
prints tables for people and JSON with ``--output json``, confirms a change as
``pulsar-admin`` does ("Created successfully"), and on an error prints the worker's reason
and exits with 1.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from magnetar.cli.admin import admin_client, fqfn_options, resolve_fqfn
from magnetar.cli.function_flags import config_fields, function_config_options, is_url
from magnetar.cli.render import emit_json, table
from magnetar.exceptions import MagnetarError

if TYPE_CHECKING:
    from magnetar.cli.context import CliContext

__all__ = ["register_admin_commands"]

_INSTANCE_ID = click.option(
    "--instance-id", type=click.IntRange(min=0), help="One instance [default: all]."
)


def _path(fqfn: str, *rest: object) -> str:
    return "/".join(["/admin/v3/functions", fqfn, *(str(part) for part in rest)])


def _done(obj: CliContext, message: str, **fields: Any) -> None:
    if obj.output == "json":
        emit_json(fields)
    else:
        click.echo(message)


def _code_part(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The multipart form for the code named by ``py`` or ``js``: a file part, or a ``url``
    field."""
    if fields.get("py") and fields.get("js"):
        raise click.UsageError("pass either --py or --js, not both")
    field = "js" if fields.get("js") else "py"
    code = fields.get(field)
    if not code:
        return {}, {}
    if is_url(code):
        fields[field] = Path(code.split("?")[0]).name
        return {"url": code}, {}
    path = Path(code)
    if not path.is_file():
        raise click.BadParameter(f"{code} does not exist", param_hint=f"'--{field}'")
    fields[field] = path.name
    return {}, {"data": (path.name, path.read_bytes())}


def _submit(obj: CliContext, method: str, fqfn: str, fields: dict[str, Any]) -> None:
    form, files = _code_part(fields)
    tenant, namespace, name = fqfn.split("/")
    fields.update(tenant=tenant, namespace=namespace, name=name)
    form["functionConfig"] = json.dumps(fields)
    admin_client(obj).request(method, _path(fqfn), data=form, files=files or None)


def _identity(
    fields: dict[str, Any],
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
) -> str:
    """The FQFN from the flags, else from the config file, else named after the script or
    the class (as localrun names it)."""
    if fqfn or name:
        return resolve_fqfn(tenant, namespace, name, fqfn)
    name = fields.get("name")
    if not name and fields.get("js"):
        name = Path(str(fields["js"])).stem
    if not name and fields.get("className"):
        name = str(fields["className"]).rsplit(".", 1)[-1]
    if not name:
        raise click.UsageError("name the function: --name NAME (or --fqfn, or --classname)")
    return resolve_fqfn(
        tenant or fields.get("tenant"), namespace or fields.get("namespace"), name, None
    )


@click.command()
@fqfn_options
@function_config_options
@click.pass_obj
def create(
    obj: CliContext,
    /,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    function_config_file: str | None,
    **flags: Any,
) -> None:
    """Register a function on the cluster and start its instances.

    \b
    Example:
      magnetar functions create --py examples/exclamation.py \\
          --classname exclamation.ExclamationFunction --inputs in --output out --parallelism 3
    """
    from magnetar.instance.config import FunctionConfig

    fields = config_fields(function_config_file, **flags)
    target = _identity(fields, tenant, namespace, name, fqfn)
    tenant_, namespace_, name_ = target.split("/")
    try:  # fail here, naming the field, rather than after uploading the code
        FunctionConfig.parse({**fields, "tenant": tenant_, "namespace": namespace_, "name": name_})
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    if not fields.get("py") and not fields.get("js"):
        raise click.UsageError(
            "pass the function's code: --py FILE (.py or .zip), --js FILE, or a URL"
        )
    _submit(obj, "POST", target, fields)
    _done(obj, "Created successfully", created=target)


@click.command()
@fqfn_options
@function_config_options
@click.pass_obj
def update(
    obj: CliContext,
    /,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    function_config_file: str | None,
    **flags: Any,
) -> None:
    """Change a function: only the given flags (and config file fields) change; with --py
    its code too. Its instances restart or scale to match.

    \b
    Example:
      magnetar functions update --name excl --parallelism 5
    """
    fields = config_fields(function_config_file, **flags)
    target = _identity(fields, tenant, namespace, name, fqfn)
    _submit(obj, "PUT", target, fields)
    _done(obj, "Updated successfully", updated=target)


@click.command()
@fqfn_options
@click.pass_obj
def delete(
    obj: CliContext, tenant: str | None, namespace: str | None, name: str | None, fqfn: str | None
) -> None:
    """Stop a function's instances and remove it.

    \b
    Example:
      magnetar functions delete --name excl
    """
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    admin_client(obj).request("DELETE", _path(target))
    _done(obj, "Deleted successfully", deleted=target)


@click.command()
@fqfn_options
@click.pass_obj
def get(
    obj: CliContext, tenant: str | None, namespace: str | None, name: str | None, fqfn: str | None
) -> None:
    """Show a function's config (Pulsar's FunctionConfig).

    \b
    Example:
      magnetar functions get --fqfn public/default/excl
    """
    config = admin_client(obj).get_json(_path(resolve_fqfn(tenant, namespace, name, fqfn)))
    if obj.output == "json":
        emit_json(config)
    else:
        rows = [
            (key, json.dumps(value) if isinstance(value, dict | list) else value)
            for key, value in sorted(config.items())
        ]
        click.echo(table(("field", "value"), rows))


@click.command("list")
@click.option("--tenant", default="public", show_default=True, help="Tenant to list.")
@click.option("--namespace", default="default", show_default=True, help="Namespace to list.")
@click.pass_obj
def list_functions(obj: CliContext, tenant: str, namespace: str) -> None:
    """List the functions of a namespace.

    \b
    Example:
      magnetar functions list --tenant public --namespace default
    """
    names = admin_client(obj).get_json(f"/admin/v3/functions/{tenant}/{namespace}")
    if obj.output == "json":
        emit_json(names)
    elif names:
        click.echo(table(("name",), [(n,) for n in names]))
    else:
        click.echo(f"no functions in {tenant}/{namespace}", err=True)


_STATUS_HEADERS = (
    "instance",
    "running",
    "worker",
    "received",
    "processed",
    "user exc",
    "system exc",
    "restarts",
    "avg ms",
    "error",
)


def _status_row(instance_id: int, status: dict[str, Any]) -> tuple[Any, ...]:
    return (
        instance_id,
        "yes" if status.get("running") else "no",
        status.get("workerId") or "-",
        status.get("numReceived", 0),
        status.get("numSuccessfullyProcessed", 0),
        status.get("numUserExceptions", 0),
        status.get("numSystemExceptions", 0),
        status.get("numRestarts", 0),
        float(status.get("averageLatency") or 0.0),
        status.get("error") or "",
    )


@click.command()
@fqfn_options
@_INSTANCE_ID
@click.pass_obj
def status(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    instance_id: int | None,
) -> None:
    """Show whether each instance runs, where, and what it has processed.

    \b
    Example:
      magnetar functions status --name excl
      magnetar --output json functions status --name excl --instance-id 0
    """
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    client = admin_client(obj)
    if instance_id is not None:
        one = client.get_json(_path(target, instance_id, "status"))
        answer: dict[str, Any] = one
        rows = [_status_row(instance_id, one)]
    else:
        answer = client.get_json(_path(target, "status"))
        rows = [_status_row(i["instanceId"], i["status"]) for i in answer["instances"]]
    if obj.output == "json":
        emit_json(answer)
        return
    if instance_id is None:
        click.echo(
            f"{target}: {answer['numRunning']} of {answer['numInstances']} instances running"
        )
    click.echo(table(_STATUS_HEADERS, rows))
    for row in rows:
        for exception in _latest_exceptions(answer, row[0]):
            click.echo(f"instance {row[0]}: {exception}", err=True)


def _latest_exceptions(answer: dict[str, Any], instance_id: int) -> list[str]:
    statuses = [i["status"] for i in answer.get("instances", []) if i["instanceId"] == instance_id]
    status_ = statuses[0] if statuses else answer
    found = [*status_.get("latestUserExceptions", []), *status_.get("latestSystemExceptions", [])]
    return [e["exceptionString"] for e in found[-3:]]


_STATS_HEADERS = (
    "instance",
    "received",
    "processed",
    "user exc",
    "system exc",
    "avg ms",
    "p99 ms",
    "1 min recv",
    "1 min done",
)


def _stats_row(instance_id: Any, metrics: dict[str, Any]) -> tuple[Any, ...]:
    minute = metrics.get("1min") or {}
    return (
        instance_id,
        metrics.get("receivedTotal", 0),
        metrics.get("processedSuccessfullyTotal", 0),
        metrics.get("userExceptionsTotal", 0),
        metrics.get("systemExceptionsTotal", 0),
        float(metrics.get("avgProcessLatency") or 0.0),
        float(metrics.get("p99ProcessLatency") or 0.0),
        minute.get("receivedTotal", 0),
        minute.get("processedSuccessfullyTotal", 0),
    )


@click.command()
@fqfn_options
@_INSTANCE_ID
@click.pass_obj
def stats(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    instance_id: int | None,
) -> None:
    """Show processing counters and latencies, per instance and over the last minute.

    \b
    Example:
      magnetar functions stats --name excl
    """
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    client = admin_client(obj)
    if instance_id is not None:
        answer: dict[str, Any] = client.get_json(_path(target, instance_id, "stats"))
        rows = [_stats_row(instance_id, answer)]
    else:
        answer = client.get_json(_path(target, "stats"))
        rows = [_stats_row(i["instanceId"], i["metrics"]) for i in answer["instances"]]
        rows.append(_stats_row("all", answer))
    if obj.output == "json":
        emit_json(answer)
    else:
        click.echo(table(_STATS_HEADERS, rows))


@click.command()
@fqfn_options
@click.option("--trigger-value", help="The value to publish (text).")
@click.option(
    "--trigger-file", type=click.Path(exists=True, dir_okay=False), help="A file to publish."
)
@click.option("--topic", help="Input topic to publish to [default: the first input].")
@click.pass_obj
def trigger(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    trigger_value: str | None,
    trigger_file: str | None,
    topic: str | None,
) -> None:
    """Publish a value to the function's input and print its output for that value.

    \b
    Example:
      magnetar functions trigger --name excl --trigger-value hello
    """
    if trigger_value is None and trigger_file is None:
        raise click.UsageError("Either a trigger value or a trigger filepath needs to be specified")
    if trigger_value is not None and trigger_file is not None:
        raise click.UsageError("pass one of --trigger-value and --trigger-file, not both")
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    form: dict[str, str] = {"topic": topic} if topic else {}
    files = None
    if trigger_file is not None:
        files = {"dataStream": (Path(trigger_file).name, Path(trigger_file).read_bytes())}
    else:
        form["data"] = trigger_value or ""
    response = admin_client(obj).request("POST", _path(target, "trigger"), data=form, files=files)
    output = response.text if response.status_code != 204 else None
    if obj.output == "json":
        emit_json({"output": output})
    elif output is None:
        click.echo(f"{target} has no output topic: the value was published", err=True)
    else:
        click.echo(output)


@click.command()
@fqfn_options
@click.option(
    "--instance-id", type=click.IntRange(min=0), default=0, show_default=True, help="The instance."
)
@click.option(
    "--lines", type=click.IntRange(min=0), default=100, show_default=True, help="Lines to show."
)
@click.option("--follow", "-f", is_flag=True, help="Go on printing what the instance logs.")
@click.pass_obj
def logs(
    obj: CliContext,
    tenant: str | None,
    namespace: str | None,
    name: str | None,
    fqfn: str | None,
    instance_id: int,
    lines: int,
    follow: bool,
) -> None:
    """Print an instance's log: what the function prints and logs (from the worker that runs it).

    \b
    Example:
      magnetar functions logs --name excl --instance-id 0 --lines 50 --follow
    """
    target = resolve_fqfn(tenant, namespace, name, fqfn)
    client = admin_client(obj)
    path = _path(target, instance_id, "logs")
    answer = client.request("GET", path, params={"lines": lines})
    click.echo(answer.text, nl=False)
    while follow:
        time.sleep(_FOLLOW_INTERVAL_S)
        since = answer.headers.get("x-log-offset", "0")
        answer = client.request("GET", path, params={"lines": lines, "since": since})
        click.echo(answer.text, nl=False)


_FOLLOW_INTERVAL_S = 1.0


def _run_state_command(op: str, past: str) -> click.Command:
    @click.command(op)
    @fqfn_options
    @_INSTANCE_ID
    @click.pass_obj
    def command(
        obj: CliContext,
        tenant: str | None,
        namespace: str | None,
        name: str | None,
        fqfn: str | None,
        instance_id: int | None,
    ) -> None:
        target = resolve_fqfn(tenant, namespace, name, fqfn)
        path = _path(target, op) if instance_id is None else _path(target, instance_id, op)
        admin_client(obj).request("POST", path)
        _done(obj, f"{past.capitalize()} successfully", **{past: target, "instanceId": instance_id})

    command.help = (
        f"{op.capitalize()} a function's instances, or one with --instance-id.\n\n"
        f"\b\nExample:\n  magnetar functions {op} --name excl --instance-id 0"
    )
    return command


def register_admin_commands(group: click.Group) -> None:
    """Add the cluster commands to the `functions` group."""
    for command in (create, update, delete, get, list_functions, status, stats, trigger, logs):
        group.add_command(command)
    for op, past in (("start", "started"), ("stop", "stopped"), ("restart", "restarted")):
        group.add_command(_run_state_command(op, past))
