"""Talking to a worker's REST admin API from the CLI: one client, one error shape.

Every admin command goes through :class:`AdminClient`: it adds the bearer token, turns a
refused connection into a message naming the URL, and a non-2xx answer into
:class:`AdminError` carrying the server's ``reason``, which commands print before exiting
non-zero (as ``pulsar-admin`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
import httpx

if TYPE_CHECKING:
    from magnetar.cli.app import CliContext

__all__ = ["AdminClient", "AdminError", "admin_client", "fqfn_options", "resolve_fqfn"]


class AdminError(click.ClickException):
    """An admin call failed; the message is the server's reason (or why it was not reached)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


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
    try:
        reason = response.json()["reason"]
    except (ValueError, KeyError, TypeError):
        reason = response.text.strip()[:300] or response.reason_phrase
    return f"{reason} (HTTP {response.status_code})"


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
    """``tenant/namespace/name`` from the identity flags; a usage error when it is incomplete."""
    if fqfn:
        parts = fqfn.split("/")
        if len(parts) != 3 or not all(parts):
            raise click.BadParameter(
                f"{fqfn!r} is not tenant/namespace/name", param_hint="'--fqfn'"
            )
        if tenant or namespace or name:
            raise click.UsageError("pass either --fqfn or --tenant/--namespace/--name, not both")
        return fqfn
    if not name:
        raise click.UsageError("name the function: --name NAME (or --fqfn tenant/namespace/name)")
    return f"{tenant or 'public'}/{namespace or 'default'}/{name}"
