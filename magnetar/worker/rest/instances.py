"""The paths about a function's instances: status, stats, start, stop and restart, for the
whole function or one instance (``.../{instanceId}/...``).

Whole-function answers gather every instance; each instance is answered by the worker that
runs it (see ``peers``), so any worker answers for the whole cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter, Request
from starlette.convertors import IntegerConvertor, register_url_convertor

from magnetar.instance.metrics import MetricsSnapshot, WindowCounts
from magnetar.worker.exceptions import FunctionNotFoundError
from magnetar.worker.functions import FunctionChange, Operation
from magnetar.worker.metadata import FunctionRecord
from magnetar.worker.model import instance_key
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.peers import call_worker, raise_for_answer, services
from magnetar.worker.rest.services import RestServices

__all__ = ["function_record", "instances_router"]

instances_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])


class _InstanceIdConvertor(IntegerConvertor):
    """An instance id, negative ones included: Pulsar answers them (400 for status and
    stats, every instance for start and stop) where an unsigned int would not match (404)."""

    regex = "-?[0-9]+"


register_url_convertor("instance_id", _InstanceIdConvertor())

_FUNCTION = "/{tenant}/{namespace}/{name}"
_INSTANCE = "/{tenant}/{namespace}/{name}/{instance_id:instance_id}"


def function_record(found: RestServices, tenant: str, namespace: str, name: str) -> FunctionRecord:
    """The function's record; 404 "Function {name} doesn't exist" when there is none."""
    record = found.metadata.get(f"{tenant}/{namespace}/{name}")
    if record is None:
        raise FunctionNotFoundError(f"Function {name} doesn't exist")
    return record


def _instance_ids(
    found: RestServices, record: FunctionRecord, instance_id: int | None
) -> list[int]:
    # a record admission does not let through (invalid, or past a limit) answers why
    parallelism = found.functions.admission.scheduled_parallelism(record)
    if instance_id is None:
        return list(range(parallelism))
    if not 0 <= instance_id < parallelism:
        name = record.fqfn.rsplit("/", 1)[-1]
        raise ApiError(400, f"Function {name} doesn't have instance with id {instance_id}")
    return [instance_id]


def _owner(found: RestServices, record: FunctionRecord, instance_id: int) -> str | None:
    current = found.assignments.current
    return current.assignment.get(instance_key(record.fqfn, instance_id)) if current else None


# --- status and stats ---------------------------------------------------------------------


def _snapshot_or_reason(
    request: Request, record: FunctionRecord, instance_id: int, kind: str
) -> MetricsSnapshot | dict[str, Any] | str:
    """The local snapshot of an instance, the owner's JSON answer about it (``kind`` is
    "status" or "stats"), or why it is not running."""
    found = services(request)
    owner = _owner(found, record, instance_id)
    # a stopped instance is asked of its worker too: it runs until it has drained
    stopped = instance_id in record.stopped
    if owner is None:
        return "stopped" if stopped else "Function has not been scheduled"
    if owner == found.config.worker_id:
        snapshot = found.instances.status(instance_key(record.fqfn, instance_id))
        if snapshot is None:
            return "stopped" if stopped else "starting"
        return snapshot
    try:
        response = call_worker(
            request, owner, "GET", f"/admin/v3/functions/{record.fqfn}/{instance_id}/{kind}"
        )
    except ApiError as error:
        return error.reason
    if response.status_code != 200:
        return f"worker {owner} answered {response.status_code}"
    answer: dict[str, Any] = response.json()
    return answer


def _instance_status(request: Request, record: FunctionRecord, instance_id: int) -> dict[str, Any]:
    """The ``status`` object of Pulsar's FunctionInstanceStatus."""
    found = _snapshot_or_reason(request, record, instance_id, "status")
    if isinstance(found, MetricsSnapshot):
        return dict(found.status()["status"])
    if isinstance(found, dict):
        return found
    return dict(_idle(instance_id).status()["status"]) | {"error": found}


def _instance_stats(request: Request, record: FunctionRecord, instance_id: int) -> dict[str, Any]:
    """Pulsar's FunctionInstanceStatsData of one instance (zeros when it is not running)."""
    found = _snapshot_or_reason(request, record, instance_id, "stats")
    if isinstance(found, MetricsSnapshot):
        return dict(found.stats()["metrics"])
    if isinstance(found, dict):
        return found
    return dict(_idle(instance_id).stats()["metrics"])


def _every_instance(
    request: Request,
    record: FunctionRecord,
    answer: Callable[[Request, FunctionRecord, int], dict[str, Any]],
) -> dict[int, dict[str, Any]]:
    """``answer`` for every instance, by instance id; the owners are asked at the same time
    (one after the other, each answer would wait for the previous worker's)."""
    found = services(request)
    ids = _instance_ids(found, record, None)
    here = found.config.worker_id
    remote = sum(1 for i in ids if _owner(found, record, i) not in (None, here))
    if remote < 2:
        return {i: answer(request, record, i) for i in ids}
    with ThreadPoolExecutor(max_workers=min(remote, 16), thread_name_prefix="status") as pool:
        answers = pool.map(lambda i: answer(request, record, i), ids)
        return dict(zip(ids, answers, strict=True))


@instances_router.get(_FUNCTION + "/status")
def function_status(request: Request, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    """FunctionStatus: every instance's status, asked of the worker that runs it."""
    record = function_record(services(request), tenant, namespace, name)
    statuses = _every_instance(request, record, _instance_status)
    return {
        "numInstances": len(statuses),
        "numRunning": sum(1 for status in statuses.values() if status["running"]),
        "instances": [{"instanceId": i, "status": status} for i, status in statuses.items()],
    }


@instances_router.get(_INSTANCE + "/status")
def instance_status(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> dict[str, Any]:
    """FunctionInstanceStatusData of one instance."""
    record = function_record(services(request), tenant, namespace, name)
    _instance_ids(services(request), record, instance_id)
    return _instance_status(request, record, instance_id)


@instances_router.get(_FUNCTION + "/stats")
def function_stats(request: Request, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    """FunctionStats: totals over the instances, the last minute, and each instance."""
    record = function_record(services(request), tenant, namespace, name)
    stats = _every_instance(request, record, _instance_stats)
    metrics = list(stats.values())
    return {
        **_totals(metrics),
        "1min": _totals([m.get("1min", {}) for m in metrics]),
        "lastInvocation": max((m.get("lastInvocation") or 0 for m in metrics), default=0),
        "instances": [{"instanceId": i, "metrics": m} for i, m in stats.items()],
    }


@instances_router.get(_INSTANCE + "/stats")
def instance_stats(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> dict[str, Any]:
    """FunctionInstanceStatsData of one instance."""
    record = function_record(services(request), tenant, namespace, name)
    _instance_ids(services(request), record, instance_id)
    return _instance_stats(request, record, instance_id)


_TOTALS = (
    "receivedTotal",
    "processedSuccessfullyTotal",
    "systemExceptionsTotal",
    "userExceptionsTotal",
)


def _totals(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums of the counters; the latency is the mean over instances that processed any."""
    totals: dict[str, Any] = {field: sum(m.get(field) or 0 for m in metrics) for field in _TOTALS}
    latencies = [m["avgProcessLatency"] for m in metrics if m.get("processedSuccessfullyTotal")]
    totals["avgProcessLatency"] = sum(latencies) / len(latencies) if latencies else None
    return totals


def _idle(instance_id: int) -> MetricsSnapshot:
    return MetricsSnapshot(
        instance_id=instance_id,
        running=False,
        error="",
        received=0,
        processed=0,
        user_exceptions=0,
        system_exceptions=0,
        latest_user_exceptions=[],
        latest_system_exceptions=[],
        average_latency_ms=0.0,
        p99_latency_ms=0.0,
        last_invocation_ms=0,
        user_metrics={},
        last_minute=WindowCounts(),
    )


# --- start, stop, restart -----------------------------------------------------------------


def _run_state(
    request: Request, tenant: str, namespace: str, name: str, op: Operation, instance_id: int | None
) -> None:
    """Start or stop; the leader refuses what changes nothing (400 "Operation not
    permitted"), as Pulsar does. A negative instance id means every instance, as in
    Pulsar's FunctionMetaDataUtils."""
    found = services(request)
    record = function_record(found, tenant, namespace, name)
    every = instance_id is None or instance_id < 0
    change = FunctionChange(op, record.fqfn, instance_id=None if every else instance_id)
    found.functions.submit(change, request.headers.get("authorization"))


def _restart(request: Request, record: FunctionRecord, instance_id: int | None) -> None:
    """Restart the instances that run, each by its worker; a stopped one stays stopped (as
    in Pulsar, where restarting it does nothing)."""
    found = services(request)
    parallelism = found.functions.admission.scheduled_parallelism(record)
    ids = [instance_id] if instance_id is not None else list(range(parallelism))
    ids = [i for i in ids if 0 <= i < parallelism]
    running = [i for i in ids if i not in record.stopped]
    owners = {i: owner for i in running if (owner := _owner(found, record, i)) is not None}
    # Pulsar's answers where it finds no assignment: for one instance (out of range, or
    # not scheduled yet) and for a function none of whose instances is scheduled
    out_of_range = instance_id is not None and not 0 <= instance_id < parallelism
    if out_of_range or (instance_id is not None and running and not owners):
        raise ApiError(400, f"{record.fqfn}/{instance_id} doesn't exist")
    if instance_id is None and running and not owners:
        raise ApiError(400, f"{record.fqfn} has not been assigned yet")
    for i, owner in owners.items():
        if owner == found.config.worker_id:
            if not found.instances.restart(instance_key(record.fqfn, i)):
                raise ApiError(503, f"instance {i} of {record.fqfn} is not running here yet")
            continue
        path = f"/admin/v3/functions/{record.fqfn}/{i}/restart"
        raise_for_answer(call_worker(request, owner, "POST", path))


@instances_router.post(_FUNCTION + "/start", status_code=204)
def start(request: Request, tenant: str, namespace: str, name: str) -> None:
    """Start every instance (kept in the metadata, so it survives restarts)."""
    _run_state(request, tenant, namespace, name, "start", None)


@instances_router.post(_INSTANCE + "/start", status_code=204)
def start_instance(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> None:
    _run_state(request, tenant, namespace, name, "start", instance_id)


@instances_router.post(_FUNCTION + "/stop", status_code=204)
def stop(request: Request, tenant: str, namespace: str, name: str) -> None:
    """Stop every instance gracefully; they stay stopped until started."""
    _run_state(request, tenant, namespace, name, "stop", None)


@instances_router.post(_INSTANCE + "/stop", status_code=204)
def stop_instance(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> None:
    _run_state(request, tenant, namespace, name, "stop", instance_id)


@instances_router.post(_FUNCTION + "/restart", status_code=204)
def restart(request: Request, tenant: str, namespace: str, name: str) -> None:
    """Restart every running instance (each drains first)."""
    _restart(request, function_record(services(request), tenant, namespace, name), None)


@instances_router.post(_INSTANCE + "/restart", status_code=204)
def restart_instance(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> None:
    _restart(request, function_record(services(request), tenant, namespace, name), instance_id)
