"""Apache Pulsar's state paths: ``GET/POST /admin/v3/functions/{tenant}/{namespace}/{name}/
state/{key}``, with Pulsar's FunctionState JSON.

A query is answered from this worker's table of the function once it has caught up with the
journal's end, so it sees every update journaled before the call, whichever worker's
instances made it. As in Apache Pulsar, a counter is returned in ``numberValue``, a value in
``stringValue`` when it is UTF-8 text and in ``byteValue`` (base64) otherwise; a put sets
``stringValue`` or ``byteValue``. Magnetar also lets a put set a counter (``numberValue``,
a signed 64-bit integer), which Pulsar refuses.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from magnetar.instance.timers import pending_timers
from magnetar.statestore import (
    MAX_VALUE_BYTES,
    InvalidStateUpdateError,
    StateEntry,
    StateJournalError,
    StateQueryService,
)
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = ["delete_function_state", "state_router"]

state_router = APIRouter(prefix="/admin/v3/functions", tags=["state"])

_MAX_FORM_PART = 4 * MAX_VALUE_BYTES
"""Room for the largest value, base64-encoded, in the ``state`` part."""
_INT64 = (-(2**63), 2**63 - 1)
_MAX_TIMERS_LISTED = 100_000


def _services(request: Request) -> tuple[RestServices, StateQueryService]:
    services: RestServices = request.app.state.services
    if services.state is None:
        raise ApiError(503, "this worker serves no function state")
    return services, services.state


def _epoch(services: RestServices, fqfn: str) -> int:
    record = services.metadata.get(fqfn)
    if record is None:
        raise ApiError(404, f"Function {fqfn.rsplit('/', 1)[-1]} doesn't exist")
    return record.config_version


@state_router.get("/{tenant}/{namespace}/{name}/state/{key:path}")
def get_state(request: Request, tenant: str, namespace: str, name: str, key: str) -> dict[str, Any]:
    """A key's FunctionState, once this worker has applied the journal up to its end."""
    services, state = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    _epoch(services, fqfn)
    try:
        entry = state.get(fqfn, key)
    except StateJournalError as error:
        raise ApiError(503, str(error)) from None
    if entry is None:
        raise ApiError(404, f"key '{key}' doesn't exist.")
    return function_state(key, entry)


@state_router.get("/{tenant}/{namespace}/{name}/timers")
def get_timers(
    request: Request, tenant: str, namespace: str, name: str, limit: int = 1000
) -> list[dict[str, Any]]:
    """The function's pending timers, soonest first (at most ``limit``), once this worker
    has applied the journal up to its end."""
    services, state = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    _epoch(services, fqfn)
    if not 1 <= limit <= _MAX_TIMERS_LISTED:
        raise ApiError(400, f"limit must be 1 to {_MAX_TIMERS_LISTED}, not {limit}")

    def scan(start: str, stop: str, count: int) -> list[tuple[str, bytes | None]]:
        return [(key, entry.value) for key, entry in state.scan(fqfn, start, stop, count)]

    try:
        return [timer.to_json() for timer in pending_timers(scan, limit)]
    except StateJournalError as error:
        raise ApiError(503, str(error)) from None


@state_router.post("/{tenant}/{namespace}/{name}/state/{key:path}", status_code=204)
async def put_state(request: Request, tenant: str, namespace: str, name: str, key: str) -> None:
    """Store a value (or a counter) from the multipart field ``state`` (FunctionState JSON);
    returns once this worker's table holds it."""
    services, state = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    epoch = _epoch(services, fqfn)
    async with request.form(max_part_size=_MAX_FORM_PART) as form:
        part = form.get("state")
        raw = await part.read() if isinstance(part, UploadFile) else part
    if raw is None:
        raise ApiError(400, "the request needs a multipart field 'state' with FunctionState JSON")
    value, counter = parse_function_state(raw, key)
    try:
        await run_in_threadpool(state.put, fqfn, key, epoch, value, counter)
    except InvalidStateUpdateError as error:
        raise ApiError(400, str(error)) from None
    except StateJournalError as error:
        raise ApiError(503, str(error)) from None


def function_state(key: str, entry: StateEntry) -> dict[str, Any]:
    """Apache Pulsar's FunctionState JSON of an entry."""
    string_value = byte_value = None
    if entry.value is not None:
        try:
            string_value = entry.value.decode()
        except UnicodeDecodeError:
            byte_value = base64.b64encode(entry.value).decode()
    return {
        "key": key,
        "stringValue": string_value,
        "byteValue": byte_value,
        "numberValue": entry.counter,
        "version": entry.version,
    }


def parse_function_state(raw: str | bytes, key: str) -> tuple[bytes | None, int | None]:
    """The value (or counter) a FunctionState JSON sets; ApiError 400 saying what is wrong."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(400, f"state is not valid FunctionState JSON: {error}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "state must be a JSON object (FunctionState)")
    if data.get("key", key) != key:
        raise ApiError(400, "Path key doesn't match key in json")
    given = [f for f in ("stringValue", "byteValue", "numberValue") if data.get(f) is not None]
    if not given:
        # Pulsar's reason for a state without a value (it takes no counter at all)
        raise ApiError(400, "Setting Counter values not supported in put state")
    if len(given) != 1:
        raise ApiError(
            400,
            "state must set exactly one of stringValue, byteValue (base64) and numberValue; "
            f"it sets {', '.join(given)}",
        )
    field = given[0]
    content = data[field]
    if field == "numberValue":
        if isinstance(content, bool) or not isinstance(content, int):
            raise ApiError(400, f"numberValue must be an integer counter, got {content!r}")
        if not _INT64[0] <= content <= _INT64[1]:
            raise ApiError(400, f"numberValue {content} does not fit a signed 64-bit integer")
        return None, content
    if not isinstance(content, str):
        raise ApiError(400, f"{field} must be a string, got {type(content).__name__}")
    if field == "stringValue":
        value = content.encode()
    else:
        try:
            value = base64.b64decode(content, validate=True)
        except binascii.Error as error:
            raise ApiError(400, f"byteValue is not valid base64: {error}") from None
    if len(value) > MAX_VALUE_BYTES:
        raise ApiError(
            400,
            f"the value is {len(value):,} bytes, more than the limit of {MAX_VALUE_BYTES:,} "
            "bytes (1 MiB)",
        )
    return value, None


def delete_function_state(services: RestServices, fqfn: str) -> None:
    """After ``fqfn`` was deleted: delete its state too (records its instances still send
    are ignored)."""
    if services.state is None:
        return
    try:
        services.state.delete_state(fqfn, services.metadata.version_of(fqfn))
    except StateJournalError as error:
        raise ApiError(
            503, f"function {fqfn} was deleted, but its state could not be deleted: {error}"
        ) from None
