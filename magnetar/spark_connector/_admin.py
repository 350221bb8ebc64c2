"""The few calls of Pulsar's admin REST API the connector makes with ``admin.url``.

Topic listing (for ``topicsPattern``), topic existence (``waitingForNonExistedTopic``) and
schemas. Authentication and TLS come from ``pulsar.admin.*``, else from ``pulsar.client.*``
(as StreamNative: "if not given explicitly, the client configuration is used for admin as
well"). The embedded broker has no admin API: a refused connection is reported as
:class:`AdminUnavailableError` so callers can fall back where the binary protocol will do.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from magnetar.spark_connector.exceptions import InvalidOptionError, PulsarReadError

__all__ = ["AdminClient", "AdminUnavailableError", "admin_headers"]

_TIMEOUT_S = 30.0


class AdminUnavailableError(PulsarReadError):
    """Nothing answered at ``admin.url`` (refused, unreachable, or not an HTTP server)."""


class AdminClient:
    """Pulsar's admin API at one URL."""

    def __init__(self, url: str, conf: Mapping[str, str]) -> None:
        """``conf`` holds Java client field names (``authPluginClassName``, ``authParams``,
        ``tlsTrustCertsFilePath``, ``tlsAllowInsecureConnection``, ...)."""
        if not url.startswith(("http://", "https://")):
            raise InvalidOptionError(
                f"admin.url {url!r} is not an HTTP URL of Pulsar's admin API, e.g. "
                "http://localhost:8080"
            )
        self.url = url.rstrip("/")
        self._headers = admin_headers(conf)
        self._ssl = _ssl_context(conf) if url.startswith("https://") else None
        timeout_ms = conf.get("requestTimeoutMs") or conf.get("connectionTimeoutMs")
        self._timeout = int(timeout_ms) / 1000 if timeout_ms else _TIMEOUT_S

    def topics(self, tenant: str, namespace: str, persistent: bool = True) -> list[str]:
        """Full names of the namespace's topics; a partitioned topic by its own name, not its
        partitions'."""
        domain = "persistent" if persistent else "non-persistent"
        base = f"/admin/v2/{domain}/{_path(tenant)}/{_path(namespace)}"
        every = self._get(base)
        partitioned = self._get(base + "/partitioned")
        names = {_without_partition(name) for name in every} | set(partitioned)
        return sorted(names)

    def topic_exists(self, topic: str) -> bool:
        """Whether ``topic`` (a full name) exists as a topic or a partitioned topic."""
        domain, _, rest = topic.partition("://")
        tenant, namespace, _name = rest.split("/")
        try:
            listed = self.topics(tenant, namespace, domain == "persistent")
        except _NotFoundError:
            return False  # no such namespace
        return topic in listed

    def schema(self, topic: str) -> dict[str, Any] | None:
        """The topic's latest schema as the API gives it (``type``, ``data``,
        ``properties``), or None when it has none."""
        _domain, _, rest = topic.partition("://")
        tenant, namespace, name = rest.split("/")
        try:
            answer = self._get(
                f"/admin/v2/schemas/{_path(tenant)}/{_path(namespace)}/{_path(name)}/schema"
            )
        except _NotFoundError:
            return None
        if not isinstance(answer, dict) or "type" not in answer:
            raise PulsarReadError(f"admin API at {self.url} gave no schema for {topic}: {answer}")
        return answer

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise _NotFoundError(path) from None
            raise PulsarReadError(
                f"admin API at {self.url} answered {error.code} to GET {path}: {_reason(error)}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise AdminUnavailableError(
                f"no Pulsar admin API answers at admin.url {self.url} ({reason})"
            ) from None


class _NotFoundError(Exception):
    """404: no such namespace, topic or schema."""


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read())
        return str(body.get("reason", body)) if isinstance(body, dict) else str(body)
    except (ValueError, OSError):
        return error.reason


def _path(part: str) -> str:
    return quote(part, safe="")


def _without_partition(topic: str) -> str:
    head, sep, index = topic.rpartition("-partition-")
    return head if sep and index.isdigit() else topic


def admin_headers(conf: Mapping[str, str]) -> dict[str, str]:
    """HTTP headers carrying the credentials of ``authPluginClassName`` / ``authParams``."""
    plugin = conf.get("authPluginClassName", "")
    params = conf.get("authParams", "")
    if "authParamMap" in conf and not params:
        params = conf["authParamMap"]
    if not plugin:
        return {"Accept": "application/json"}
    name = plugin.rsplit(".", 1)[-1]
    if name == "AuthenticationToken":
        token = _token(params)
        return {"Accept": "application/json", "Authorization": f"Bearer {token}"}
    if name == "AuthenticationBasic":
        user, password = _basic(params)
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Accept": "application/json", "Authorization": f"Basic {pair}"}
    if name == "AuthenticationTls":
        return {"Accept": "application/json"}  # the client certificate, see _ssl_context
    raise InvalidOptionError(
        f"authPluginClassName {plugin!r} cannot be used with admin.url here: use "
        "AuthenticationToken, AuthenticationBasic or AuthenticationTls in pulsar.admin.*"
    )


def _token(params: str) -> str:
    text = params.strip()
    if text.startswith("{"):
        text = str(json.loads(text).get("token", ""))
    if text.startswith("file:"):
        return Path(text.removeprefix("file:").removeprefix("//")).read_text().strip()
    return text.removeprefix("token:")


def _basic(params: str) -> tuple[str, str]:
    text = params.strip()
    if text.startswith("{"):
        data = json.loads(text)
        return str(data.get("userId", "")), str(data.get("password", ""))
    user, _, password = text.partition(":")
    return user, password


def _ssl_context(conf: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=conf.get("tlsTrustCertsFilePath") or None)
    if conf.get("tlsAllowInsecureConnection", "").lower() == "true":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif conf.get("tlsHostnameVerificationEnable", "").lower() == "false":
        context.check_hostname = False
    params = conf.get("authParams", "")
    if conf.get("authPluginClassName", "").endswith("AuthenticationTls") and params:
        fields = dict(item.split(":", 1) for item in params.split(",") if ":" in item)
        if "tlsCertFile" in fields and "tlsKeyFile" in fields:
            context.load_cert_chain(fields["tlsCertFile"], fields["tlsKeyFile"])
    return context
