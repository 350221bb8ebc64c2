"""Checking every admin request's token and role (when the worker has authentication on).

One dependency on the whole app: routes under ``/admin/v3/functions/{tenant}/...`` and
``/admin/v2/namespaces/{tenant}/...`` need an admin of that tenant (or a superuser), every
other admin path (tenants among them) a superuser. Readiness,
``/version`` and ``/metrics`` stay open (health checks and scrapers carry no token, as with
Pulsar's defaults). The path a worker forwards a function change on checks the tenant of the
change itself, with the caller's token that came along.
"""

from __future__ import annotations

from fastapi import Request

from magnetar.worker.rest.peers import services

__all__ = ["authorize_request", "caller_role"]

_OPEN_PATHS = frozenset({"/version", "/metrics", "/admin/v2/worker/cluster/leader/ready"})
_TENANT_PATHS = ("/admin/v3/functions/", "/admin/v2/namespaces/")


def authorize_request(request: Request) -> None:
    """FastAPI dependency: 401 without a valid token, 403 when the role may not do this."""
    auth = services(request).auth
    if auth is None or request.url.path in _OPEN_PATHS:
        return
    role = auth.authenticator.role(request.headers.get("authorization"))
    request.state.role = role
    tenant = request.path_params.get("tenant")
    if request.url.path.startswith(_TENANT_PATHS) and tenant is not None:
        auth.authorizer.require_tenant(role, tenant)
    elif not request.url.path.startswith("/admin/v2/worker/internal/"):
        auth.authorizer.require_superuser(role)


def caller_role(request: Request) -> str | None:
    """The authenticated role of this request; None when authentication is off."""
    role: str | None = getattr(request.state, "role", None)
    return role
