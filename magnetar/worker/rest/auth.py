"""Checking every admin request's token and role (when the worker has authentication on).

One dependency on the whole app: routes under ``/admin/v3/functions/{tenant}/...`` and
``/admin/v2/namespaces/{tenant}/...`` need an admin of that tenant (or a superuser), every
other admin path (tenants among them) a superuser. A role that may not answers 401 with
Apache Pulsar's reason for that path (its functions worker and broker say 401, not 403). Readiness,
``/version`` and ``/metrics`` stay open (health checks and scrapers carry no token, as with
Pulsar's defaults), and so do the web console's page and assets, which hold no data: each call
the page makes carries the user's token and is checked here. The path a worker forwards a
function change on checks the tenant of the change itself, with the caller's token that came
along.
"""

from __future__ import annotations

from fastapi import Request

from magnetar.worker.exceptions import AuthorizationError
from magnetar.worker.rest.console import CONSOLE_PATH
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.peers import services

__all__ = ["authorize_request", "caller_role", "not_authorized"]

_OPEN_PATHS = frozenset({"/version", "/metrics", "/admin/v2/worker/cluster/leader/ready"})
_TENANT_PATHS = ("/admin/v3/functions/", "/admin/v2/namespaces/")


def authorize_request(request: Request) -> None:
    """FastAPI dependency: 401 without a valid token, or when the role may not do this."""
    auth = services(request).auth
    path = request.url.path
    if auth is None or path in _OPEN_PATHS or _is_console(path):
        return
    role = auth.authenticator.role(request.headers.get("authorization"))
    request.state.role = role
    tenant = request.path_params.get("tenant")
    try:
        if path.startswith(_TENANT_PATHS) and tenant is not None:
            auth.authorizer.require_tenant(role, tenant)
        elif not path.startswith("/admin/v2/worker/internal/"):
            auth.authorizer.require_superuser(role)
    except AuthorizationError:
        raise not_authorized(path, request.method) from None


def _is_console(path: str) -> bool:
    return path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/")


def not_authorized(path: str, method: str) -> ApiError:
    """Pulsar's refusal of a role that may not call ``path``."""
    if path.startswith("/admin/v2/namespaces/"):
        reason = "Don't have permission to administrate resources on this tenant"
    elif path.startswith(("/admin/v2/tenants", "/admin/v2/clusters")):
        reason = "This operation requires super-user access"
    elif path.endswith("/drain") and method == "GET":
        reason = "Client is not authorized to get the status of a drain operation"
    elif path.endswith("/drain"):
        reason = "Client is not authorized to perform drain operation"
    else:
        reason = "Client is not authorized to perform operation"
    return ApiError(401, reason)


def caller_role(request: Request) -> str | None:
    """The authenticated role of this request; None when authentication is off."""
    role: str | None = getattr(request.state, "role", None)
    return role
