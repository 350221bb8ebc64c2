"""`magnetar functions-worker ...`: the cluster as `pulsar-admin functions-worker` shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from magnetar.cli.admin import admin_client
from magnetar.cli.render import emit_json, table

if TYPE_CHECKING:
    from magnetar.cli.context import CliContext

__all__ = ["functions_worker"]

_WORKER = "/admin/v2/worker"


@click.group("functions-worker")
def functions_worker() -> None:
    """Inspect and operate the worker cluster (like `pulsar-admin functions-worker`)."""


def _workers_table(obj: CliContext, workers: list[dict[str, Any]]) -> None:
    if obj.output == "json":
        emit_json(workers)
        return
    rows = [(w["workerId"], w["adminUrl"]) for w in workers]
    click.echo(table(("worker", "admin url"), rows))


@functions_worker.command("get-cluster")
@click.pass_obj
def get_cluster(obj: CliContext) -> None:
    """List the live workers.

    \b
    Example:
      magnetar functions-worker get-cluster
    """
    _workers_table(obj, admin_client(obj).get_json(f"{_WORKER}/cluster"))


@functions_worker.command("get-cluster-leader")
@click.pass_obj
def get_cluster_leader(obj: CliContext) -> None:
    """Show the leader, which schedules instances onto workers."""
    _workers_table(obj, [admin_client(obj).get_json(f"{_WORKER}/cluster/leader")])


@functions_worker.command("get-function-assignments")
@click.pass_obj
def get_function_assignments(obj: CliContext) -> None:
    """Show which worker runs each instance.

    \b
    Example:
      magnetar functions-worker get-function-assignments
    """
    assignments: dict[str, list[str]] = admin_client(obj).get_json(f"{_WORKER}/assignments")
    if obj.output == "json":
        emit_json(assignments)
        return
    rows = [(w, key) for w, keys in sorted(assignments.items()) for key in keys]
    click.echo(table(("worker", "instance"), rows))


@functions_worker.command()
@click.pass_obj
def rebalance(obj: CliContext) -> None:
    """Spread the instances evenly over the live workers."""
    admin_client(obj).request("PUT", f"{_WORKER}/rebalance")
    if obj.output == "json":
        emit_json({"rebalance": "requested"})
    else:
        click.echo("Rebalance requested")


@functions_worker.command()
@click.option("--worker-id", help="The worker to drain [default: the one --admin-url names].")
@click.pass_obj
def drain(obj: CliContext, worker_id: str | None) -> None:
    """Move every instance off a worker, which then gets no new ones.

    \b
    Example:
      magnetar functions-worker drain --worker-id worker-2
    """
    client = admin_client(obj)
    if worker_id:
        client.request("PUT", f"{_WORKER}/leader/drain", params={"workerId": worker_id})
    else:
        client.request("PUT", f"{_WORKER}/drain")
    if obj.output == "json":
        emit_json({"drain": worker_id or "this worker"})
    else:
        click.echo(f"Draining {worker_id or 'the worker at ' + client.admin_url}")


@functions_worker.command("get-drain-status")
@click.option("--worker-id", help="The worker [default: the one --admin-url names].")
@click.pass_obj
def get_drain_status(obj: CliContext, worker_id: str | None) -> None:
    """Whether a worker is draining and how many instances it still runs."""
    client = admin_client(obj)
    if worker_id:
        answer = client.get_json(f"{_WORKER}/leader/drain", workerId=worker_id)
    else:
        answer = client.get_json(f"{_WORKER}/drain")
    if obj.output == "json":
        emit_json(answer)
    else:
        rows = [(answer["workerId"], answer["status"], answer["instancesLeft"])]
        click.echo(table(("worker", "status", "instances left"), rows))


@functions_worker.command("function-stats")
@click.pass_obj
def function_stats(obj: CliContext) -> None:
    """Stats of every instance on the worker --admin-url names."""
    stats: list[dict[str, Any]] = admin_client(obj).get_json(
        "/admin/v2/worker-stats/functionsmetrics"
    )
    if obj.output == "json":
        emit_json(stats)
        return
    rows = [
        (
            s["name"],
            s["metrics"]["receivedTotal"],
            s["metrics"]["processedSuccessfullyTotal"],
            s["metrics"]["userExceptionsTotal"],
            s["metrics"]["systemExceptionsTotal"],
            float(s["metrics"]["avgProcessLatency"] or 0.0),
        )
        for s in stats
    ]
    headers = ("instance", "received", "processed", "user exc", "system exc", "avg ms")
    click.echo(table(headers, rows))
