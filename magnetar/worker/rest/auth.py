"""Checking every admin request's token and role (when the worker has authentication on).

One dependency on the whole app: routes under ``/admin/v3/functions/{tenant}/...`` and
``/admin/v2/namespaces/{tenant}/...`` need an admin of that tenant (or a superuser), every
other admin path (tenants among them) a superuser. A role that may not answers 401 with
Apache Pulsar's reason for that path (its functions worker and broker say 401, not 403). Readiness,
``/version`` and ``/metrics`` stay open (health checks and scrapers carry no token, as with
Pulsar's defaults), and so do the web console's page and assets, which hold no data: each call
the page makes carries the user's token and is checked here. The internal paths a worker
forwards changes on take calls from the cluster's workers only (sealed with the cluster key,
``magnetar.worker.cluster_key``): a token, a tenant admin's or a superuser's, is not enough;
the caller's token that came along is checked for the tenant of the change all the same.

The topics a function names are checked at register and update (``authorize_topics``) by
the one rule of ``magnetar.topic_policy``: 401 with Pulsar's reason for another tenant's
topic, 400 for a topic of the system namespace.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from magnetar.instance.config import FunctionConfig
from magnetar.topic_policy import check_topics
from magnetar.worker.cluster_key import PEER_HEADER
from magnetar.worker.exceptions import AuthorizationError
from magnetar.worker.function_auth import FunctionAuthData
from magnetar.worker.rest.console import CONSOLE_PATH
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.peers import services

__all__ = [
    "INTERNAL_PATHS",
    "authenticate_worker",
    "authorize_request",
    "authorize_topics",
    "caller_auth_data",
    "caller_role",
    "not_authorized",
]

_OPEN_PATHS = frozenset({"/version", "/metrics", "/admin/v2/worker/cluster/leader/ready"})
_TENANT_PATHS = ("/admin/v3/functions/", "/admin/v2/namespaces/")
INTERNAL_PATHS = "/admin/v2/worker/internal/"
"""Where workers call each other (forwarded changes); no client may."""


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
        elif not path.startswith(INTERNAL_PATHS):
            auth.authorizer.require_superuser(role)
    except AuthorizationError:
        raise not_authorized(path, request.method) from None


async def authenticate_worker(request: Request) -> None:
    """FastAPI dependency: 401 on an internal path unless the call is sealed by a worker of
    this cluster (any path, when the cluster has no key)."""
    seal = services(request).peer_seal
    path = request.url.path
    if seal is None or not path.startswith(INTERNAL_PATHS):
        return
    body = await request.body()
    seal.verify(request.method, path, body, request.headers.get(PEER_HEADER))


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


def authorize_topics(request: Request, tenant: str, config: FunctionConfig) -> None:
    """Refuse a function of ``tenant`` that names a topic its caller may not give it:
    another tenant's (401, unless the caller is a superuser or authentication is off) or
    one of the system namespace (400, whoever calls)."""
    found = services(request)
    role = caller_role(request)
    superuser = found.auth is None or (
        role is not None and found.auth.authorizer.is_superuser(role)
    )
    refusal = check_topics(
        config.model_dump(by_alias=True, exclude_none=True),
        tenant,
        found.config.system_namespace,
        superuser,
    )
    if refusal is not None:
        raise ApiError(400 if refusal.system else 401, refusal.reason)


def caller_auth_data(request: Request) -> dict[str, Any] | None:
    """The caller's role and token, to keep with a function it submits (``function_auth``);
    None when authentication is off."""
    role = caller_role(request)
    if role is None:
        return None
    authorization = request.headers.get("authorization")
    auth_data = FunctionAuthData.from_authorization(role, authorization)
    return auth_data.to_json(services(request).token_seal)
