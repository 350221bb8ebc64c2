"""``POST .../trigger``: publish a value to a function's input and answer with its output."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, Response, UploadFile
from starlette.concurrency import run_in_threadpool

from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.instances import function_record
from magnetar.worker.rest.peers import services

__all__ = ["trigger_router"]

trigger_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])

_MAX_TRIGGER_BYTES = 5 * 1024 * 1024


@trigger_router.post(
    "/{tenant}/{namespace}/{name}/trigger",
    responses={200: {"content": {"text/plain": {}}}, 408: {"description": "no output in time"}},
)
async def trigger(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    data: Annotated[str | None, Form()] = None,
    data_stream: Annotated[UploadFile | None, File(alias="dataStream")] = None,
    topic: Annotated[str | None, Form()] = None,
) -> Response:
    """Publish ``dataStream`` (a file) or ``data`` (text) to ``topic`` (default: the only
    input) and return the function's output for it: 204 when it has no output topic, 408
    when none arrives in time."""
    found = services(request)
    if data is None and data_stream is None:
        raise ApiError(400, "Trigger Data is not provided")
    record = function_record(found, tenant, namespace, name)
    if data_stream is not None:
        value = await data_stream.read(_MAX_TRIGGER_BYTES + 1)
        if len(value) > _MAX_TRIGGER_BYTES:
            raise ApiError(413, f"the trigger value is larger than {_MAX_TRIGGER_BYTES} bytes")
    else:
        value = (data or "").encode()
    output = await run_in_threadpool(
        found.trigger.trigger,
        record.function_config(),
        value,
        topic,
        found.config.request_timeout_s,
    )
    if output is None:
        return Response(status_code=204)
    try:
        return Response(output.decode(), media_type="text/plain; charset=utf-8")
    except UnicodeDecodeError:
        return Response(output, media_type="application/octet-stream")
