"""A function's own credentials, as Apache's function auth providers arrange them.

With authentication on, the token a function was submitted with is kept with its record
(Apache's ``FunctionAuthData``, as ``ClearTextFunctionTokenAuthProvider`` keeps it), beside
its config: ``functions get`` shows the config only. The instance connects to the broker with
that token, never with the worker's credentials, so the broker's authorization (Apache
Pulsar) applies to what the function does with its client, and the role decides where
``context.publish`` may reach. An update keeps the credentials unless it asks for new ones
(``updateOptions.updateAuthData``), as in Pulsar.

The token is kept sealed (AES-GCM, with a key derived from the cluster key): the metadata
topic is readable by any client of a broker without authorization (pulsar-lite), and a
token in clear there would let one tenant's function act as another tenant's admin.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from magnetar.client import Connection
from magnetar.instance.publish_policy import PublishPolicy
from magnetar.worker.cluster_key import ClusterKey

__all__ = ["TOKEN_AUTH_PLUGIN", "FunctionAccess", "FunctionAuthData", "TokenSeal"]

TOKEN_AUTH_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


_TOKEN_PURPOSE = b"function-token"
_SEALED = "v1:"


class TokenSeal:
    """Seals a function's token for its record, and opens it for its instances."""

    def __init__(self, cluster_key: ClusterKey) -> None:
        self._aead = AESGCM(cluster_key.derive(_TOKEN_PURPOSE))

    def seal(self, role: str, token: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, token.encode(), role.encode())
        return _SEALED + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, role: str, sealed: str) -> str:
        """The token; ValueError when it was not sealed with this key for ``role``."""
        if not sealed.startswith(_SEALED):
            raise ValueError("not a sealed token")
        raw = base64.urlsafe_b64decode(sealed.removeprefix(_SEALED))
        try:
            return self._aead.decrypt(raw[:12], raw[12:], role.encode()).decode()
        except InvalidTag:
            raise ValueError("the token was sealed with another cluster key") from None


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

    def to_json(self, seal: TokenSeal | None) -> dict[str, Any]:
        """For the function's record: the token sealed when the cluster has a key."""
        if seal is None:
            return {"role": self.role, "token": self.token}
        return {"role": self.role, "sealedToken": seal.seal(self.role, self.token)}

    @classmethod
    def from_json(
        cls, data: dict[str, Any] | None, seal: TokenSeal | None
    ) -> FunctionAuthData | None:
        """From the function's record; ValueError when its token cannot be opened."""
        if not data:
            return None
        role = str(data["role"])
        if "sealedToken" not in data:
            return cls(role, str(data["token"]))
        if seal is None:
            raise ValueError("the function's token is sealed, and this worker has no cluster key")
        return cls(role, seal.open(role, str(data["sealedToken"])))


class FunctionAccess:
    """What an instance of a function may reach: its broker credentials and its publish
    policy, from the worker's settings and the function's auth data."""

    def __init__(
        self,
        authentication_enabled: bool,
        superuser_roles: Iterable[str],
        system_namespace: str,
        seal: TokenSeal | None = None,
    ) -> None:
        """``seal``: opens the tokens kept in the functions' records."""
        self.seal = seal
        self._authentication_enabled = authentication_enabled
        self._superusers = frozenset(superuser_roles)
        self._system_namespace = system_namespace

    def connection(self, auth: FunctionAuthData | None) -> Connection | None:
        """The instance's client credentials: the function's token (None without one)."""
        if not self._authentication_enabled or auth is None:
            return None
        return Connection(TOKEN_AUTH_PLUGIN, f"token:{auth.token}")

    def role(self, auth: FunctionAuthData | None) -> str | None:
        """The role the instance connects as (None when it connects without credentials)."""
        return auth.role if self.connection(auth) is not None and auth is not None else None

    def publish_policy(self, auth: FunctionAuthData | None) -> PublishPolicy:
        """Never the system namespace; with authentication on, other tenants' topics only
        for a superuser's function."""
        other_tenants = not self._authentication_enabled or (
            auth is not None and auth.role in self._superusers
        )
        return PublishPolicy(self._system_namespace, other_tenants)
