"""Talking to a worker's REST admin API from the CLI: one client, one error shape.

Every admin command goes through :class:`AdminClient`: it adds the bearer token, turns a
refused connection into a message naming the URL, and a non-2xx answer into
:class:`AdminError` carrying the server's ``reason``, which commands print as ``pulsar-admin``
does (the reason, a blank line, ``Reason: <reason>``) before exiting with 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
import httpx

if TYPE_CHECKING:
    from magnetar.cli.app import CliContext

__all__ = [
    "AdminClient",
    "AdminError",
    "admin_client",
    "fqfn_options",
    "resolve_fqfn",
]


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


class AdminClient:
    """HTTP calls to one worker's admin API."""

    def __init__(self, admin_url: str, auth_token: str | None = None, timeout: float = 60.0):
        self.admin_url = admin_url.rstrip("/")
        headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._http = httpx.Client(base_url=self.admin_url, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request (``kwargs`` as for httpx); raises :class:`AdminError` unless 2xx."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise AdminError(f"the worker at {self.admin_url} did not answer in time") from None
        except httpx.HTTPError as error:
            raise AdminError(
                f"cannot reach the Magnetar worker at {self.admin_url} ({error}); is it "
                "running? Pass --admin-url or set MAGNETAR_ADMIN_URL"
            ) from None
        if response.is_success:
            return response
        raise AdminError(_reason(response), response.status_code)

    def get_json(self, path: str, **params: Any) -> Any:
        """GET ``path`` and decode its JSON body."""
        return self.request("GET", path, params=params or None).json()

    def close(self) -> None:
        self._http.close()


def _reason(response: httpx.Response) -> str:
    """The ``reason`` of an error answer, or what the body says instead."""
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
