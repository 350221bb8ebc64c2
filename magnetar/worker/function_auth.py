"""A function's own credentials, as Apache's function auth providers arrange them.

With authentication on, the token a function was submitted with is kept with its record
(Apache's ``FunctionAuthData``, as ``ClearTextFunctionTokenAuthProvider`` keeps it), beside
its config: ``functions get`` shows the config only. The instance connects to the broker with
that token, never with the worker's credentials, so the broker's authorization (Apache
Pulsar) applies to what the function does with its client, and the role decides where
``context.publish`` may reach. An update keeps the credentials unless it asks for new ones
(``updateOptions.updateAuthData``), as in Pulsar.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from magnetar.client import Connection
from magnetar.instance.publish_policy import PublishPolicy

__all__ = ["TOKEN_AUTH_PLUGIN", "FunctionAccess", "FunctionAuthData"]

TOKEN_AUTH_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@dataclass(frozen=True)
class FunctionAuthData:
    """The submitter's role and token, kept with the function."""

    role: str
    token: str

    @classmethod
    def from_authorization(cls, role: str | None, authorization: str | None) -> FunctionAuthData:
        """From an authenticated request: its role and its ``Bearer`` token."""
        _, _, token = (authorization or "").partition(" ")
        if role is None or not token.strip():
            raise ValueError("an authenticated request has a role and a bearer token")
        return cls(role, token.strip())

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "token": self.token}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> FunctionAuthData | None:
        if not data:
            return None
        return cls(str(data["role"]), str(data["token"]))


class FunctionAccess:
    """What an instance of a function may reach: its broker credentials and its publish
    policy, from the worker's settings and the function's auth data."""

    def __init__(
        self,
        authentication_enabled: bool,
        superuser_roles: Iterable[str],
        system_namespace: str,
    ) -> None:
        self._authentication_enabled = authentication_enabled
        self._superusers = frozenset(superuser_roles)
        self._system_namespace = system_namespace

    def connection(self, auth: FunctionAuthData | None) -> Connection | None:
        """The instance's client credentials: the function's token (None without one)."""
        if not self._authentication_enabled or auth is None:
            return None
        return Connection(TOKEN_AUTH_PLUGIN, f"token:{auth.token}")

    def publish_policy(self, auth: FunctionAuthData | None) -> PublishPolicy:
        """Never the system namespace; with authentication on, other tenants' topics only
        for a superuser's function."""
        other_tenants = not self._authentication_enabled or (
            auth is not None and auth.role in self._superusers
        )
        return PublishPolicy(self._system_namespace, other_tenants)
