"""Tenants and namespaces from an Apache Pulsar broker's admin API (``/admin/v2``).

With ``pulsar_admin_url`` the broker is the source of truth: the worker relays each call
and answers with the broker's own status and reason. A function registration checks its
tenant and namespace as Pulsar's FunctionsImpl does: a tenant the broker does not know is
400 "Tenant does not exist", a namespace missing from the tenant's list 400 "Namespace does
not exist".
"""

from __future__ import annotations

from typing import Any

import httpx

from magnetar.worker.broker_admin import BrokerAdmin, path_segment, reason_of
from magnetar.worker.exceptions import RequestRefusedError
from magnetar.worker.tenancy import check_namespace_name

__all__ = ["BrokerTenancy"]

_NOT_FOUND = 404


class BrokerTenancy:
    """A :class:`~magnetar.worker.tenancy.Tenancy` answered by the broker's admin API."""

    def __init__(self, admin: BrokerAdmin) -> None:
        self._admin = admin

    def clusters(self) -> list[str]:
        return _strings(self._call("GET", "/admin/v2/clusters"))

    def tenants(self) -> list[str]:
        return _strings(self._call("GET", "/admin/v2/tenants"))

    def tenant(self, tenant: str) -> dict[str, Any]:
        info = self._call("GET", _tenant_path(tenant)).json()
        return info if isinstance(info, dict) else {}

    def create_tenant(self, tenant: str, info: Any, authorization: str | None) -> None:
        self._call("PUT", _tenant_path(tenant), json=info)

    def update_tenant(self, tenant: str, info: Any, authorization: str | None) -> None:
        self._call("POST", _tenant_path(tenant), json=info)

    def delete_tenant(self, tenant: str, force: bool, authorization: str | None) -> None:
        self._call("DELETE", _tenant_path(tenant), params=_force(force))

    def namespaces(self, tenant: str) -> list[str]:
        return _strings(self._call("GET", f"/admin/v2/namespaces/{path_segment(tenant)}"))

    def create_namespace(self, namespace: str, policies: Any, authorization: str | None) -> None:
        self._call("PUT", _namespace_path(namespace), json=policies)

    def delete_namespace(self, namespace: str, force: bool, authorization: str | None) -> None:
        self._call("DELETE", _namespace_path(namespace), params=_force(force))

    def check_namespace(self, tenant: str, namespace: str) -> None:
        answer = self._admin.relay("GET", _tenant_path(tenant))
        if answer.status_code == _NOT_FOUND:
            raise RequestRefusedError("Tenant does not exist")
        _raise_for(answer)
        listed = self.namespaces(tenant)
        if f"{tenant}/{namespace}" not in listed:
            raise RequestRefusedError("Namespace does not exist")

    def is_tenant_admin(self, tenant: str, role: str) -> bool:
        # asked each time: the broker's adminRoles change without the worker being told
        answer = self._admin.relay("GET", _tenant_path(tenant))
        if answer.status_code == _NOT_FOUND:
            return False
        _raise_for(answer)
        try:
            roles = answer.json().get("adminRoles")
        except (ValueError, AttributeError):
            return False
        return isinstance(roles, list) and role in roles

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = self._admin.relay(method, path, **kwargs)
        _raise_for(answer)
        return answer


def _raise_for(answer: httpx.Response) -> None:
    """The broker's refusal, passed on with its status and reason."""
    if not answer.is_success:
        raise RequestRefusedError(reason_of(answer), answer.status_code)


def _tenant_path(tenant: str) -> str:
    return f"/admin/v2/tenants/{path_segment(tenant)}"


def _namespace_path(namespace: str) -> str:
    tenant, local = check_namespace_name(namespace)
    return f"/admin/v2/namespaces/{path_segment(tenant)}/{path_segment(local)}"


def _force(force: bool) -> dict[str, str]:
    return {"force": "true"} if force else {}


def _strings(answer: httpx.Response) -> list[str]:
    try:
        value = answer.json()
    except ValueError:
        value = None
    if not isinstance(value, list):
        raise RequestRefusedError(
            f"the broker's admin API answered {answer.request.url.path} with "
            f"{answer.text[:200]!r}, not a list",
            502,
        )
    return [str(item) for item in value]
