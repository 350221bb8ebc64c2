"""Talking to a worker's REST admin API from the CLI: one client, one error shape.

Every admin command goes through :class:`AdminClient`: it adds the bearer token, turns a
refused connection into a message naming the URL, and a non-2xx answer into
:class:`AdminError` carrying the server's ``reason``, which commands print as ``pulsar-admin``
does (the reason, a blank line, ``Reason: <reason>``) before exiting with 1.

The client is the standard library's ``http.client``: a command answers in about the time
Python takes to import what it needs, and an HTTP library with its TLS set-up (httpx loads
the CA certificates for every client) would double what `magnetar functions list` costs.
"""

from __future__ import annotations

import http.client
import json as _json
import ssl
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import click

if TYPE_CHECKING:
    from magnetar.cli.context import CliContext

__all__ = [
    "AdminClient",
    "AdminError",
    "AdminResponse",
    "admin_client",
    "fqfn_options",
    "resolve_fqfn",
]

Files = Mapping[str, tuple[str | None, bytes | str]]
"""Multipart parts: field name -> (file name, or None for a plain field; content)."""


class AdminError(click.ClickException):
    """An admin call failed; the message is the server's reason (or why it was not reached)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code

    def show(self, file: Any = None) -> None:
        if self.status_code is None:
            super().show(file)
            return
        # pulsar-admin prints the server's error, then its reason
        click.echo(f"{self.message}\n\nReason: {self.message}", file=file, err=file is None)


@dataclass(frozen=True)
class AdminResponse:
    """A worker's answer."""

    status_code: int
    content: bytes
    reason_phrase: str
    headers: dict[str, str] = field(default_factory=dict)
    """Header names in lower case."""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return _json.loads(self.content)


class AdminClient:
    """HTTP calls to one worker's admin API."""

    def __init__(self, admin_url: str, auth_token: str | None = None, timeout: float = 60.0):
        self.admin_url = admin_url.rstrip("/")
        parts = urlsplit(self.admin_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AdminError(
                f"the admin URL must look like http://host:port, got {admin_url!r}; pass "
                "--admin-url or set MAGNETAR_ADMIN_URL"
            )
        self._parts = parts
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        data: Mapping[str, str] | None = None,
        files: Files | None = None,
        json: Any = None,
    ) -> AdminResponse:
        """Send a request with ``params`` in the query and ``data`` as a form (multipart
        with ``files``), or ``json`` as a JSON body; raises :class:`AdminError` unless the
        answer is 2xx."""
        target = self._parts.path + path + (f"?{urlencode(params)}" if params else "")
        if json is not None:
            body: bytes | None = _json.dumps(json).encode()
            content_type: str | None = "application/json"
        else:
            body, content_type = _encode_form(data or {}, files or {})
        headers = dict(self._headers)
        if content_type:
            headers["Content-Type"] = content_type
        connection = self._connection()
        try:
            connection.request(method, target, body=body, headers=headers)
            answer = connection.getresponse()
            response = AdminResponse(
                answer.status,
                answer.read(),
                answer.reason,
                {name.lower(): value for name, value in answer.getheaders()},
            )
        except TimeoutError:
            raise AdminError(f"the worker at {self.admin_url} did not answer in time") from None
        except (OSError, http.client.HTTPException) as error:
            raise AdminError(
                f"cannot reach the Magnetar worker at {self.admin_url} ({error}); is it "
                "running? Pass --admin-url or set MAGNETAR_ADMIN_URL"
            ) from None
        finally:
            connection.close()
        if response.is_success:
            return response
        raise AdminError(_reason(response), response.status_code)

    def get_json(self, path: str, **params: Any) -> Any:
        """GET ``path`` and decode its JSON body."""
        return self.request("GET", path, params=params or None).json()

    def _connection(self) -> http.client.HTTPConnection:
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            return http.client.HTTPSConnection(
                host, port, timeout=self._timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(host, port, timeout=self._timeout)


def _encode_form(data: Mapping[str, str], files: Files) -> tuple[bytes | None, str | None]:
    """The request body and its content type: a URL-encoded form, or multipart with files."""
    if not files:
        if not data:
            return None, None
        return urlencode(data).encode(), "application/x-www-form-urlencoded"
    boundary = uuid.uuid4().hex
    parts: list[bytes] = []
    fields: list[tuple[str, str | None, bytes | str]] = [
        (name, None, value) for name, value in data.items()
    ]
    fields += [(name, filename, content) for name, (filename, content) in files.items()]
    for name, filename, content in fields:
        disposition = f'form-data; name="{_quote(name)}"'
        header = f"--{boundary}\r\nContent-Disposition: {disposition}"
        if filename is not None:
            header += f'; filename="{_quote(filename)}"\r\nContent-Type: application/octet-stream'
        payload = content.encode() if isinstance(content, str) else content
        parts.append(header.encode() + b"\r\n\r\n" + payload + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _quote(value: str) -> str:
    """A name or file name inside the quotes of a Content-Disposition (as browsers do)."""
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def _reason(response: AdminResponse) -> str:
    try:
        return str(response.json()["reason"])
    except (ValueError, KeyError, TypeError):
        return response.text.strip()[:300] or f"HTTP {response.status_code}"


def admin_client(obj: CliContext) -> AdminClient:
    """The client for the global ``--admin-url`` and ``--auth-token``."""
    return AdminClient(obj.admin_url, obj.auth_token)


def fqfn_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--tenant --namespace --name --fqfn``, as on every `pulsar-admin functions` command."""
    for option in reversed(
        [
            click.option("--tenant", help="Tenant of the function [default: public]."),
            click.option("--namespace", help="Namespace of the function [default: default]."),
            click.option("--name", help="Name of the function."),
            click.option("--fqfn", help="tenant/namespace/name, instead of the three above."),
        ]
    ):
        command = option(command)
    return command


def resolve_fqfn(
    tenant: str | None, namespace: str | None, name: str | None, fqfn: str | None
) -> str:
    """``tenant/namespace/name`` from the identity flags; a usage error (pulsar-admin's
    words) when it is incomplete."""
    if fqfn:
        if tenant or namespace or name:
            raise click.UsageError(
                "You must specify either a Fully Qualified Function Name (FQFN) or tenant, "
                "namespace, and function name"
            )
        parts = fqfn.split("/")
        if len(parts) != 3 or not all(parts):
            raise click.UsageError(
                "Fully qualified function names (FQFNs) must be of the form tenant/namespace/name"
            )
        return fqfn
    if not name:
        raise click.UsageError(
            "You must specify a name for the function or a Fully Qualified Function Name (FQFN)"
        )
    return f"{tenant or 'public'}/{namespace or 'default'}/{name}"
