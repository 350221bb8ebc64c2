"""Asking another worker: the owner of an instance, or the leader.

A request about an instance is answered by the worker that runs it, so any worker can answer
for the whole cluster. The caller's credentials go along, so the other worker applies the same
permissions; a forwarded request is marked, so a worker whose view of the assignment differs
answers 503 instead of forwarding it again (no loops while an assignment changes).
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import Request

from magnetar.worker.exceptions import LeaderUnavailableError
from magnetar.worker.model import WorkerInfo
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = [
    "FORWARDED_HEADER",
    "call_leader",
    "call_worker",
    "is_forwarded",
    "leader",
    "raise_for_answer",
    "services",
]

FORWARDED_HEADER = "X-Magnetar-Forwarded"


def services(request: Request) -> RestServices:
    """The worker's managers, as the app was given them."""
    found: RestServices = request.app.state.services
    return found


def is_forwarded(request: Request) -> bool:
    """Whether another worker sent this request on."""
    return FORWARDED_HEADER in request.headers


def leader(services: RestServices) -> WorkerInfo:
    """The leader on record; 503 while none is known."""
    current = services.assignments.current
    if current is None:
        raise ApiError(503, "no leader is known yet; the cluster is starting")
    return current.leader


def _send(
    request: Request, url: str, method: str, path: str, timeout: float, **kwargs: Any
) -> httpx.Response:
    headers = {FORWARDED_HEADER: "1"}
    authorization = request.headers.get("authorization")
    if authorization:
        headers["Authorization"] = authorization
    return services(request).http.request(
        method, url.rstrip("/") + path, headers=headers, timeout=timeout, **kwargs
    )


def call_worker(
    request: Request, worker_id: str, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    """Send a request to the worker ``worker_id``; ApiError 503 when it cannot be reached
    and when this request was itself forwarded (the assignment is changing)."""
    found = services(request)
    if is_forwarded(request):
        raise ApiError(503, "the assignment is changing; retry in a moment")
    current = found.assignments.current
    urls = {w.worker_id: w.admin_url for w in (current.workers if current else [])}
    url = urls.get(worker_id)
    if url is None:
        raise ApiError(503, f"worker {worker_id} is not a live member of the cluster")
    try:
        return _send(request, url, method, path, found.config.request_timeout_s, **kwargs)
    except httpx.HTTPError as error:
        raise ApiError(503, f"worker {worker_id} at {url} did not answer: {error}") from None


def call_leader(request: Request, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """Send a leader-only request to the leader; its error answers are raised as theirs."""
    found = services(request)
    current = leader(found)
    try:
        response = _send(
            request, current.admin_url, method, path, found.config.request_timeout_s, **kwargs
        )
    except httpx.HTTPError as error:
        raise LeaderUnavailableError(
            f"the leader at {current.admin_url} cannot be reached: {error}"
        ) from None
    raise_for_answer(response)
    return response


def raise_for_answer(response: httpx.Response) -> None:
    """Pass another worker's error answer on to our caller, with its code and reason."""
    if response.status_code < 400:
        return
    try:
        reason = str(response.json()["reason"])
    except (ValueError, KeyError, TypeError):
        reason = response.text[:300] or f"HTTP {response.status_code}"
    raise ApiError(response.status_code, reason)
