"""The worker paths under ``/admin/v2/worker``: membership, leader, assignments, rebalance,
drain; plus the internal paths a non-leader forwards function, tenant and namespace changes
to."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Body, Query, Request

from magnetar.worker.exceptions import AuthorizationError, NotLeaderError
from magnetar.worker.functions import FORWARD_PATH, FunctionChange
from magnetar.worker.model import WorkerInfo
from magnetar.worker.package_registry import FORWARD_PATH as PACKAGES_FORWARD_PATH
from magnetar.worker.package_registry import PackageChange
from magnetar.worker.rest.auth import (
    authorize_topics,
    caller_auth_data,
    caller_role,
    not_authorized,
)
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.peers import call_leader, leader
from magnetar.worker.rest.peers import services as _services
from magnetar.worker.tenancy import FORWARD_PATH as TENANCY_FORWARD_PATH
from magnetar.worker.tenancy import TenancyChange

__all__ = ["cluster_router"]


def _worker_json(worker: WorkerInfo) -> dict[str, Any]:
    url = urlsplit(worker.admin_url)
    return {
        "workerId": worker.worker_id,
        "workerHostname": url.hostname,
        "port": url.port,
        "adminUrl": worker.admin_url,
    }


cluster_router = APIRouter(prefix="/admin/v2/worker", tags=["worker"])


@cluster_router.get("/cluster")
def get_cluster(request: Request) -> list[dict[str, Any]]:
    """The live workers, as the leader last published them."""
    current = _services(request).assignments.current
    return [_worker_json(w) for w in current.workers] if current else []


@cluster_router.get("/cluster/leader")
def get_leader(request: Request) -> dict[str, Any]:
    return _worker_json(leader(_services(request)))


@cluster_router.get("/cluster/leader/ready")
def get_ready(request: Request) -> bool:
    """True once this worker has caught up and knows the leader; 503 before."""
    if not _services(request).ready():
        raise ApiError(503, "the worker is not ready yet: catching up with the cluster")
    return True


@cluster_router.get("/assignments")
def get_assignments(request: Request) -> dict[str, list[str]]:
    """Worker id -> the instance keys assigned to it."""
    current = _services(request).assignments.current
    result: dict[str, list[str]] = {}
    if current is not None:
        for key, worker_id in sorted(current.assignment.items()):
            result.setdefault(worker_id, []).append(key)
    return result


@cluster_router.put("/rebalance", status_code=204)
def rebalance(request: Request) -> None:
    services = _services(request)
    try:
        services.leader.rebalance()
    except NotLeaderError:
        call_leader(request, "PUT", "/admin/v2/worker/rebalance")


def _drain(request: Request, worker_id: str) -> None:
    services = _services(request)
    current = services.assignments.current
    if current is not None and worker_id not in {w.worker_id for w in current.workers}:
        raise ApiError(400, f"Worker {worker_id} is not among the current workers in the system")
    try:
        services.leader.drain(worker_id)
    except NotLeaderError:
        call_leader(request, "PUT", "/admin/v2/worker/leader/drain", params={"workerId": worker_id})


def _drain_status(request: Request, worker_id: str) -> dict[str, Any]:
    current = _services(request).assignments.current
    draining = current is not None and worker_id in current.draining
    left = sum(1 for w in (current.assignment.values() if current else []) if w == worker_id)
    status = "NOT_RUN" if not draining else ("SUCCESS" if left == 0 else "IN_PROGRESS")
    return {"workerId": worker_id, "status": status, "instancesLeft": left}


@cluster_router.put("/leader/drain", status_code=204)
def drain(request: Request, worker_id: str = Query(alias="workerId")) -> None:
    """Move every instance off ``workerId`` and give it no new ones."""
    _drain(request, worker_id)


@cluster_router.get("/leader/drain")
def drain_status(request: Request, worker_id: str = Query(alias="workerId")) -> dict[str, Any]:
    """Whether ``workerId`` is draining, and how many instances it still has."""
    return _drain_status(request, worker_id)


@cluster_router.put("/drain", status_code=204)
def drain_this_worker(request: Request) -> None:
    """Drain the worker that receives this request."""
    _drain(request, _services(request).config.worker_id)


@cluster_router.get("/drain")
def drain_status_of_this_worker(request: Request) -> dict[str, Any]:
    """Whether the worker that receives this request is draining."""
    return _drain_status(request, _services(request).config.worker_id)


@cluster_router.post(FORWARD_PATH.removeprefix("/admin/v2/worker"), include_in_schema=False)
def forwarded_change(request: Request, change: Annotated[dict[str, Any], Body()]) -> dict[str, int]:
    """A function change forwarded by a worker that is not the leader."""
    services = _services(request)
    try:
        forwarded = FunctionChange.from_json(change)
    except (KeyError, TypeError) as error:
        raise ApiError(400, f"malformed function change: {error}") from None
    parts = forwarded.fqfn.split("/")
    if len(parts) != 3 or not all(parts):
        raise ApiError(400, f"malformed function change: fqfn {forwarded.fqfn!r}")
    tenant, namespace, name = parts
    role = caller_role(request)
    if services.auth is not None and role is not None:
        try:
            services.auth.authorizer.require_tenant(role, tenant)
        except AuthorizationError:
            raise not_authorized("/admin/v3/functions/", "POST") from None
    if forwarded.config is not None:
        # the leader validates what it writes, as if the change came to it directly (a
        # worker's seal proves where the call came from, not that its change is sound)
        parsed = services.functions.admission.check_config(forwarded.config)
        if parsed.fqfn != forwarded.fqfn:
            raise ApiError(
                400, f"malformed function change: its config is not {tenant}/{namespace}/{name}'s"
            )
        authorize_topics(request, tenant, parsed)
    if forwarded.auth_data is not None:
        # the credentials kept are the forwarded caller's own, whatever the body claims
        forwarded = replace(forwarded, auth_data=caller_auth_data(request))
    return {"version": services.functions.apply_forwarded(forwarded)}


@cluster_router.post(
    PACKAGES_FORWARD_PATH.removeprefix("/admin/v2/worker"), include_in_schema=False
)
def forwarded_package_change(
    request: Request, change: Annotated[dict[str, Any], Body()]
) -> dict[str, int]:
    """A package change forwarded by a worker that is not the leader."""
    services = _services(request)
    registry = services.package_registry
    if registry is None:
        raise ApiError(400, "this worker serves no package management")
    try:
        forwarded = PackageChange.from_json(change)
    except (KeyError, TypeError) as error:
        raise ApiError(400, f"malformed package change: {error}") from None
    role = caller_role(request)
    if services.auth is not None and role is not None:
        try:
            services.auth.authorizer.require_superuser(role)
        except AuthorizationError:
            raise not_authorized("/admin/v3/packages/", "POST") from None
    return {"version": registry.apply_forwarded(forwarded)}


@cluster_router.post(TENANCY_FORWARD_PATH.removeprefix("/admin/v2/worker"), include_in_schema=False)
def forwarded_tenancy_change(
    request: Request, change: Annotated[dict[str, Any], Body()]
) -> dict[str, int]:
    """A tenant or namespace change forwarded by a worker that is not the leader."""
    services = _services(request)
    tenancy = services.replicated_tenancy
    if tenancy is None:
        raise ApiError(400, "this cluster's tenants and namespaces are the broker's")
    try:
        forwarded = TenancyChange.from_json(change)
    except (KeyError, TypeError) as error:
        raise ApiError(400, f"malformed tenancy change: {error}") from None
    role = caller_role(request)
    if services.auth is not None and role is not None:
        try:
            if forwarded.kind == "tenant":
                services.auth.authorizer.require_superuser(role)
            else:
                services.auth.authorizer.require_tenant(role, forwarded.name.split("/", 1)[0])
        except AuthorizationError:
            raise not_authorized(f"/admin/v2/{forwarded.kind}s/", "POST") from None
    return {"version": tenancy.apply_forwarded(forwarded)}
