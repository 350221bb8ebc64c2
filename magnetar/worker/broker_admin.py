"""A small client of the Apache Pulsar admin REST API (``/admin/v2``): the calls Magnetar needs.

Only the worker's broker policies (``broker_policies``) use it, and only when the worker is
given ``pulsar_admin_url``. Creating something that already exists (HTTP 409) counts as done,
so every call can be repeated by every worker. A refused call raises
:class:`BrokerAdminError` naming the call and the broker's reason; a broker that cannot be
reached at all raises :class:`BrokerAdminUnreachableError`, so a caller can stop early.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from magnetar.topics import full_topic_name
from magnetar.worker.exceptions import BrokerAdminError, BrokerAdminUnreachableError

__all__ = ["FOREVER", "BrokerAdmin", "path_segment", "reason_of"]

FOREVER = -1
"""A retention time or size that keeps messages forever."""

_CONFLICT = 409
_CONNECT_TIMEOUT_S = 3.0
_NOT_FOUND = 404


class BrokerAdmin:
    """The admin API of one Apache Pulsar cluster, at ``url`` (``http://broker:8080``)."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        """``token``: the worker's own, sent as ``Bearer`` to a broker with authentication."""
        self.url = url.rstrip("/")
        # A short connect timeout: a worker starting an instance waits on an unreachable broker.
        # Redirects are followed: a broker that does not own a topic answers 307 with its owner.
        self._http = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, _CONNECT_TIMEOUT_S)),
            transport=transport,
            follow_redirects=True,
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )

    def close(self) -> None:
        self._http.close()

    # --- clusters, tenants, namespaces ------------------------------------------------------

    def clusters(self) -> list[str]:
        """The names of the clusters; also tells whether ``url`` is a Pulsar admin API at all."""
        response = self._call("GET", "/admin/v2/clusters", "list the clusters")
        names = _json(response)
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise BrokerAdminError(
                f"{self.url} does not look like the Apache Pulsar admin API: GET "
                f"/admin/v2/clusters answered {response.text[:200]!r}; give --pulsar-admin-url "
                "the broker's HTTP service URL (webServiceUrl, port 8080 by default)"
            )
        return names

    def create_tenant(self, tenant: str) -> bool:
        """Create ``tenant``, allowed on every cluster; False if it existed."""
        body = {"adminRoles": [], "allowedClusters": self.clusters()}
        response = self._call(
            "PUT",
            f"/admin/v2/tenants/{path_segment(tenant)}",
            f"create tenant {tenant}",
            json=body,
            accept=(_CONFLICT,),
        )
        return response.status_code != _CONFLICT

    def create_namespace(self, namespace: str) -> bool:
        """Create ``tenant/namespace``, and its tenant if missing; False if it existed."""
        tenant, _, name = namespace.partition("/")
        if not tenant or not name or "/" in name:
            raise BrokerAdminError(f"namespace {namespace!r} must be 'tenant/namespace'")
        path = f"/admin/v2/namespaces/{path_segment(tenant)}/{path_segment(name)}"
        what = f"create namespace {namespace}"
        response = self._call("PUT", path, what, accept=(_CONFLICT, _NOT_FOUND))
        if response.status_code == _NOT_FOUND:  # the tenant does not exist yet
            self.create_tenant(tenant)
            response = self._call("PUT", path, what, accept=(_CONFLICT,))
        return response.status_code != _CONFLICT

    def set_namespace_retention(self, namespace: str, minutes: int, size_mb: int) -> None:
        """Keep acknowledged messages of every topic in ``namespace`` (-1: forever)."""
        tenant, _, name = namespace.partition("/")
        self._call(
            "POST",
            f"/admin/v2/namespaces/{path_segment(tenant)}/{path_segment(name)}/retention",
            f"set the retention of namespace {namespace}",
            json=_retention(minutes, size_mb),
        )

    # --- topics ---------------------------------------------------------------------------

    def create_topic(self, topic: str) -> bool:
        """Create ``topic`` (not partitioned); False if it, or a partitioned one, existed."""
        response = self._call(
            "PUT", _topic_path(topic), f"create topic {topic}", accept=(_CONFLICT,)
        )
        return response.status_code != _CONFLICT

    def set_topic_retention(self, topic: str, minutes: int, size_mb: int) -> None:
        """Override the namespace's retention for one topic (an existing one)."""
        self._call(
            "POST",
            _topic_path(topic) + "/retention",
            f"set the retention of {topic}",
            json=_retention(minutes, size_mb),
        )

    def set_compaction_threshold(self, topic: str, threshold_bytes: int) -> None:
        """Have the broker compact ``topic`` (an existing one) whenever its backlog exceeds
        ``threshold_bytes``."""
        self._call(
            "POST",
            _topic_path(topic) + "/compactionThreshold",
            f"set the compaction threshold of {topic}",
            json=threshold_bytes,
        )

    def enable_deduplication(self, topic: str) -> None:
        """Have the broker drop messages whose producer sequence id it has seen (an existing
        topic)."""
        self._call(
            "POST",
            _topic_path(topic) + "/deduplicationEnabled",
            f"turn on deduplication for {topic}",
            json=True,
        )

    def grant_permission(self, topic: str, role: str, actions: list[str]) -> None:
        """Grant ``role`` ``actions`` (``produce``, ``consume``) on ``topic`` (an existing
        one: the broker answers 404 for others)."""
        self._call(
            "POST",
            _topic_path(topic) + f"/permissions/{path_segment(role)}",
            f"grant {role} {'/'.join(actions)} on {topic}",
            json=actions,
        )

    # --- the HTTP exchange ----------------------------------------------------------------

    def relay(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        what: str | None = None,
    ) -> httpx.Response:
        """Send a request and return whatever the broker answered (refusals included);
        BrokerAdminUnreachableError when it cannot be reached, naming ``what`` was asked."""
        what = what or f"{method} {path}"
        try:
            return self._http.request(method, path, json=json, params=params)
        except httpx.TransportError as error:
            raise BrokerAdminUnreachableError(
                f"cannot {what}: the Apache Pulsar admin API at {self.url} cannot be reached "
                f"({type(error).__name__}: {error or 'no detail'})"
            ) from None
        except httpx.HTTPError as error:
            raise BrokerAdminError(f"cannot {what}: {method} {self.url}{path}: {error}") from None

    def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        json: Any = None,
        accept: tuple[int, ...] = (),
    ) -> httpx.Response:
        """The response to a request that succeeded or answered one of ``accept``."""
        response = self.relay(method, path, json=json, what=what)
        if response.is_success or response.status_code in accept:
            return response
        raise BrokerAdminError(
            f"cannot {what}: {method} {self.url}{path} answered HTTP {response.status_code}: "
            f"{reason_of(response)}"
        )


def path_segment(part: str) -> str:
    """One part of an admin path (a tenant, a namespace), URL-encoded."""
    return quote(part, safe="")


def _topic_path(topic: str) -> str:
    """``persistent://t/ns/x`` -> ``/admin/v2/persistent/t/ns/x``, each part URL-encoded."""
    try:
        domain, _, rest = full_topic_name(topic).partition("://")
    except ValueError as error:
        raise BrokerAdminError(str(error)) from None
    return f"/admin/v2/{domain}/" + "/".join(path_segment(part) for part in rest.split("/"))


def _retention(minutes: int, size_mb: int) -> dict[str, int]:
    return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb}


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def reason_of(response: httpx.Response) -> str:
    """Pulsar's ``{"reason": ...}``, or the start of whatever else the body is."""
    body = _json(response)
    if isinstance(body, dict) and isinstance(body.get("reason"), str):
        return str(body["reason"])
    return response.text[:200] or response.reason_phrase
