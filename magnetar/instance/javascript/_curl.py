"""``curl(method, binding, request)``: HTTP requests from JavaScript functions, to the URL
bindings of their config only (Couchbase Eventing's call, see ``magnetar.instance.url_bindings``).

V8 cannot call Python synchronously (mini-racer turns a Python function into an async one
that answers with a Promise), yet ``curl`` returns the response. So it works like a state
read the batch's cache cannot answer: the first call the runtime has no answer for stops the
message (its effects dropped) and hands the request to Python (``need: ["h", request]``);
Python sends it, once every outcome before the message has been handled, and calls V8 again
at that message with the answers so far (``["h", index, answers]`` in ``fetched``). The
message runs again from its start: its n-th ``curl`` returns the n-th answer, so each request
goes out once though the code before it runs again (a message with k requests runs k + 1
times). Each connection (a followed redirect's too) goes to an address of the binding's host
that the worker's rule allows (``magnetar.instance.url_hosts``), resolved and checked just
before it. A failed request (timeout, refused, too large, outside the binding or the rule)
is thrown into
the script as a ``CurlError`` naming the cause; uncaught, it fails the message, which is then
retried and dead-lettered like any other failure.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript._curl_runtime import METHODS
from magnetar.instance.secrets import SecretsProvider
from magnetar.instance.url_bindings import (
    UrlAuthType,
    UrlBinding,
    UrlOutsideBindingError,
    request_url,
    under_binding,
)
from magnetar.instance.url_hosts import (
    PUBLIC_HOSTS,
    ResolvedAddress,
    UrlHostRefusedError,
    UrlHostRule,
)

__all__ = ["UrlClient"]

_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
_RESERVED_HEADERS = ("host", "content-length", "transfer-encoding", "connection")


class UrlRequestError(Exception):
    """Why a request has no response; its text is the CurlError's message."""


class UrlClient:
    """Sends the requests of one instance's script to its bindings."""

    def __init__(
        self,
        bindings: Sequence[UrlBinding],
        secrets: Mapping[str, Any],
        secrets_provider: SecretsProvider,
        hosts: UrlHostRule = PUBLIC_HOSTS,
    ) -> None:
        """``hosts``: where the worker lets bindings connect (its ``url_binding_hosts``)."""
        self._hosts = hosts
        self._bindings = {binding.alias: binding for binding in bindings}
        self._authorization: dict[str, str] = {}
        for binding in bindings:
            header = _authorization(binding, secrets, secrets_provider)
            if header is not None:
                self._authorization[binding.alias] = header
        self._tls: ssl.SSLContext | None = None  # made on the first https request (~0.1 s)

    @property
    def aliases(self) -> list[str]:
        """The bindings' aliases, as the script's settings carry them."""
        return list(self._bindings)

    def answer(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The script's answer to a request from ``curl``: ``{status, headers, body, json}``,
        or ``{error}`` naming why there is no response."""
        method = str(spec.get("method"))
        alias = str(spec.get("binding"))
        where = f"curl {method} {alias} {spec.get('path') or '/'}"
        binding = self._bindings.get(alias)
        if binding is None:
            known = ", ".join(self._bindings) or "none"
            return {"error": f"curl: {alias!r} is no URL binding of this function ({known})"}
        if method not in METHODS:
            return {"error": f"{where}: method {method} is not one of {', '.join(METHODS)}"}
        try:
            url = request_url(binding.url, str(spec.get("path") or ""), spec.get("params"))
            return self._send(binding, method, url, spec)
        except (UrlRequestError, UrlOutsideBindingError) as error:
            return {"error": f"{where}: {error}"}
        except ValueError as error:  # http.client's refusals: a header with a line break, ...
            return {"error": f"{where}: invalid request: {error}"}

    def _send(
        self, binding: UrlBinding, method: str, url: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        headers = {str(name): str(value) for name, value in (spec.get("headers") or {}).items()}
        for name in headers:
            if name.lower() in _RESERVED_HEADERS:
                raise UrlRequestError(f"header {name} is set by Magnetar, not by the script")
        body = spec.get("body")
        payload = None if body is None else str(body).encode("utf-8", "replace")
        if payload is not None and not any(n.lower() == "content-type" for n in headers):
            json_body = bool(spec.get("json"))
            headers["Content-Type"] = (
                "application/json" if json_body else "text/plain; charset=utf-8"
            )
        authorization = self._authorization.get(binding.alias)
        if authorization is not None:
            headers = {n: v for n, v in headers.items() if n.lower() != "authorization"}
            headers["Authorization"] = authorization
        deadline = time.monotonic() + binding.timeout_ms / 1000
        for _ in range(_MAX_REDIRECTS + 1):
            status, reply_headers, data = self._exchange(
                binding, method, url, headers, payload, deadline
            )
            location = reply_headers.get("location")
            if not (spec.get("redirect") and status in _REDIRECTS and location):
                return _answer(status, reply_headers, data)
            target = urljoin(url, location)
            if not under_binding(binding.url, target):
                raise UrlRequestError(
                    f"the redirect to {target} leaves the binding's URL {binding.url}"
                )
            url = target
            if status == 303 or (status in (301, 302) and method == "POST"):
                method, payload = "GET", None
        raise UrlRequestError(f"more than {_MAX_REDIRECTS} redirects")

    def _exchange(
        self,
        binding: UrlBinding,
        method: str,
        url: str,
        headers: dict[str, str],
        payload: bytes | None,
        deadline: float,
    ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            addresses = self._hosts.resolve(host, port)
        except socket.gaierror as error:
            raise UrlRequestError(f"cannot resolve {host}: {error.strerror}") from None
        except UrlHostRefusedError as error:
            raise UrlRequestError(str(error)) from None
        # past the deadline (after redirects): a tiny time limit times out at once
        remaining = max(deadline - time.monotonic(), 0.001)
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            connection = _TlsConnection(host, port, addresses, remaining, self._tls)
        else:
            connection = _Connection(host, port, addresses, remaining)
        try:
            connection.request(method, target, body=payload, headers=headers)
            reply = connection.getresponse()
            declared = reply.getheader("content-length")
            limit = binding.max_response_bytes
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise UrlRequestError(_too_large(f"{declared} bytes", limit))
            chunks: list[bytes] = []
            size = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if connection.sock is not None:
                    connection.sock.settimeout(left)
                chunk = reply.read1(_CHUNK) if method != "HEAD" else b""
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise UrlRequestError(_too_large(f"more than {limit} bytes", limit))
                chunks.append(chunk)
            reply_headers: dict[str, str] = {}
            for name, value in reply.getheaders():
                key = name.lower()
                reply_headers[key] = (
                    f"{reply_headers[key]}, {value}" if key in reply_headers else value
                )
            return reply.status, reply_headers, b"".join(chunks)
        except TimeoutError:
            raise UrlRequestError(f"timed out after {binding.timeout_ms} ms") from None
        except ConnectionRefusedError:
            raise UrlRequestError(f"connection to {parts.netloc} refused") from None
        except ssl.SSLError as error:
            raise UrlRequestError(f"TLS with {parts.netloc} failed: {error.reason}") from None
        except (OSError, http.client.HTTPException) as error:
            raise UrlRequestError(
                f"the exchange with {parts.netloc} failed: {type(error).__name__}: {error}"
            ) from None
        finally:
            connection.close()


class _Connection(http.client.HTTPConnection):
    """HTTP to the checked addresses of its host (not to what the name resolves to by the
    time it connects); the Host header still names the host."""

    def __init__(
        self, host: str, port: int, addresses: list[ResolvedAddress], timeout: float
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = _open_socket(self._addresses, self.timeout)


class _TlsConnection(http.client.HTTPSConnection):
    """HTTPS to the checked addresses of its host; the server name (SNI, certificate check)
    and the Host header are the host's."""

    def __init__(
        self,
        host: str,
        port: int,
        addresses: list[ResolvedAddress],
        timeout: float,
        context: ssl.SSLContext,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._addresses = addresses
        self._tls_context = context

    def connect(self) -> None:
        plain = _open_socket(self._addresses, self.timeout)
        try:
            self.sock = self._tls_context.wrap_socket(plain, server_hostname=self.host)
        except BaseException:
            plain.close()
            raise


def _open_socket(addresses: list[ResolvedAddress], timeout: float | None) -> socket.socket:
    """A TCP connection to the first of ``addresses`` that answers (as
    ``socket.create_connection`` tries a name's addresses)."""
    failure: OSError | None = None
    for address in addresses:
        sock = socket.socket(address.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(address.sockaddr)
            return sock
        except OSError as error:
            sock.close()
            failure = error
    raise failure or OSError("no address to connect to")


def _authorization(
    binding: UrlBinding, secrets: Mapping[str, Any], provider: SecretsProvider
) -> str | None:
    """The Authorization header of the binding's requests, from the function's secret."""
    auth = binding.auth
    if auth.type == UrlAuthType.NONE or auth.secret is None:
        return None
    value = provider.provide_secret(auth.secret, secrets.get(auth.secret))
    if value is None or value == "":
        raise FunctionLoadError(
            f"URL binding {binding.alias!r}: secret {auth.secret!r} has no value (its "
            "secrets provider returned none)"
        )
    if auth.type == UrlAuthType.BEARER:
        return f"Bearer {value}"
    token = base64.b64encode(f"{auth.username}:{value}".encode()).decode("ascii")
    return f"Basic {token}"


def _answer(status: int, headers: dict[str, str], data: bytes) -> dict[str, Any]:
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    is_json = content_type == "application/json" or content_type.endswith("+json")
    return {
        "status": status,
        "headers": headers,
        "body": data.decode("utf-8", "replace"),
        "json": is_json,
    }


def _too_large(size: str, limit: int) -> str:
    return (
        f"the response is too large: {size}, over the binding's limit of {limit} bytes "
        "(maxResponseBytes)"
    )
