"""Apache Pulsar's admin paths for clusters, tenants and namespaces: the ones
``pulsar-admin tenants list|get|create|update|delete`` and ``namespaces list|create|delete``
use, answered by the worker's tenancy (the metadata topic's, or the broker's admin API)
with Pulsar's codes: 204 on success, 404, 409, 412 as its TenantsBase and NamespacesBase."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.peers import services
from magnetar.worker.tenancy import Tenancy

__all__ = ["tenants_router"]

tenants_router = APIRouter(prefix="/admin/v2", tags=["tenants"])

_Force = Annotated[bool, Query(description="Delete what it holds too (refused, as by default)")]


def _tenancy(request: Request) -> Tenancy:
    return services(request).tenancy


def _credentials(request: Request) -> str | None:
    return request.headers.get("authorization")


async def _body(request: Request) -> Any:
    """The JSON body, or None without one."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from None


@tenants_router.get("/clusters")
def list_clusters(request: Request) -> list[str]:
    """The clusters a tenant may be allowed on."""
    return _tenancy(request).clusters()


@tenants_router.get("/tenants")
def list_tenants(request: Request) -> list[str]:
    """Every tenant."""
    return _tenancy(request).tenants()


@tenants_router.get("/tenants/{tenant}")
def get_tenant(request: Request, tenant: str) -> dict[str, Any]:
    """A tenant's TenantInfo: ``adminRoles`` and ``allowedClusters``."""
    return _tenancy(request).tenant(tenant)


@tenants_router.put("/tenants/{tenant}", status_code=204)
async def create_tenant(request: Request, tenant: str) -> None:
    """Create a tenant from a TenantInfo body (``allowedClusters`` required)."""
    info = await _body(request)
    await run_in_threadpool(_tenancy(request).create_tenant, tenant, info, _credentials(request))


@tenants_router.post("/tenants/{tenant}", status_code=204)
async def update_tenant(request: Request, tenant: str) -> None:
    """Replace a tenant's TenantInfo."""
    info = await _body(request)
    await run_in_threadpool(_tenancy(request).update_tenant, tenant, info, _credentials(request))


@tenants_router.delete("/tenants/{tenant}", status_code=204)
def delete_tenant(request: Request, tenant: str, force: _Force = False) -> None:
    """Delete a tenant that has no namespace left."""
    _tenancy(request).delete_tenant(tenant, force, _credentials(request))


@tenants_router.get("/namespaces/{tenant}")
def list_namespaces(request: Request, tenant: str) -> list[str]:
    """A tenant's namespaces, as ``tenant/namespace``."""
    return _tenancy(request).namespaces(tenant)


@tenants_router.put("/namespaces/{tenant}/{namespace}", status_code=204)
async def create_namespace(request: Request, tenant: str, namespace: str) -> None:
    """Create a namespace, with Pulsar's Policies body (optional)."""
    policies = await _body(request)
    await run_in_threadpool(
        _tenancy(request).create_namespace,
        f"{tenant}/{namespace}",
        policies,
        _credentials(request),
    )


@tenants_router.delete("/namespaces/{tenant}/{namespace}", status_code=204)
def delete_namespace(request: Request, tenant: str, namespace: str, force: _Force = False) -> None:
    """Delete a namespace that holds no function."""
    _tenancy(request).delete_namespace(f"{tenant}/{namespace}", force, _credentials(request))
