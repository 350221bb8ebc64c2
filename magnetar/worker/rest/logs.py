"""An instance's log (its stdout, stderr and logging; see ``magnetar.instance.instance_log``):
``GET /admin/v3/functions/{tenant}/{namespace}/{name}/{instanceId}/logs?lines=N``, answered by
the worker that runs the instance (another worker forwards the request, as for status).

The answer is the text of the last ``lines`` lines; its ``X-Log-Offset`` header is where the log
ends, and ``?since=<offset>`` answers what was written after it (a follower's next read).
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse

from magnetar.instance.instance_log import read_log
from magnetar.worker.model import instance_key
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.instances import function_record
from magnetar.worker.rest.peers import call_worker, raise_for_answer, services

__all__ = ["LOG_OFFSET_HEADER", "logs_router"]

logs_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])

LOG_OFFSET_HEADER = "X-Log-Offset"
_MAX_LINES = 100_000


@logs_router.get("/{tenant}/{namespace}/{name}/{instance_id:int}/logs")
def instance_logs(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    instance_id: int,
    lines: int = Query(100, ge=0, le=_MAX_LINES),
    since: int | None = Query(None, ge=0),
) -> PlainTextResponse:
    """The end of one instance's log file, as text."""
    found = services(request)
    record = function_record(found, tenant, namespace, name)
    if not 0 <= instance_id < record.function_config().parallelism:
        raise ApiError(400, f"Function {name} doesn't have instance with id {instance_id}")
    current = found.assignments.current
    owner = current.assignment.get(instance_key(record.fqfn, instance_id)) if current else None
    if owner is None:
        raise ApiError(404, f"Instance {instance_id} of function {name} is not scheduled")
    if owner != found.config.worker_id:
        params: dict[str, int] = {"lines": lines}
        if since is not None:
            params["since"] = since
        path = f"/admin/v3/functions/{record.fqfn}/{instance_id}/logs"
        answer = call_worker(request, owner, "GET", path, params=params)
        raise_for_answer(answer)
        return PlainTextResponse(
            answer.text,
            headers={LOG_OFFSET_HEADER: answer.headers.get(LOG_OFFSET_HEADER, "0")},
        )
    try:
        if found.instance_logs is None:
            raise FileNotFoundError
        log_file = found.instance_logs.path(record.fqfn, instance_id)
        text, offset = read_log(log_file, lines, since)
    except FileNotFoundError:
        raise ApiError(
            404,
            f"Instance {instance_id} of function {name} has no log on worker {owner} yet "
            "(it has not started, or runs on threads of the worker, which log to its own log)",
        ) from None
    return PlainTextResponse(text, headers={LOG_OFFSET_HEADER: str(offset)})
