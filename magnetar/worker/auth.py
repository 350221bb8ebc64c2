"""Token authentication and role-based authorization, as Apache Pulsar's token auth does it.

A client sends ``Authorization: Bearer <JWT>``. The token is signed either with a secret key
(HS256) or with a private key whose public half the worker holds (RS256/ES256); its ``sub``
claim (configurable) is the caller's *role*. Superuser roles may do everything; a tenant's
admin roles may manage that tenant's functions and namespaces only. A tenant's admin roles are
its TenantInfo's ``adminRoles`` (as in Pulsar: ``tenants create acme --admin-roles
acme-admin``), and those the worker's ``tenant_admin_roles`` adds. Keys are given as Pulsar
gives them: ``file:///path``, ``data:;base64,<key>``, a path, or the key itself in base64.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import jwt
from cryptography.hazmat.primitives.serialization import load_der_public_key

from magnetar.worker.exceptions import AuthenticationError, AuthorizationError, WorkerConfigError

__all__ = [
    "AdminAuth",
    "RoleAuthorizer",
    "TenantAdmins",
    "TokenAuthenticator",
    "create_token",
    "read_key",
]

_SECRET_ALGORITHMS = ["HS256", "HS384", "HS512"]
_PUBLIC_ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"]


def read_key(setting: str) -> bytes:
    """Key bytes from a Pulsar-style key setting (see the module docstring)."""
    if setting.startswith("data:"):
        _, _, encoded = setting.partition(",")
        return _base64(encoded, "a data: key")
    path = Path(setting.removeprefix("file://")) if setting.startswith("file:") else Path(setting)
    if setting.startswith("file:") or path.is_file():
        try:
            return path.read_bytes()
        except OSError as error:
            raise WorkerConfigError(f"cannot read the key file {path}: {error.strerror}") from None
    return _base64(setting, "the key")


def _base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise WorkerConfigError(
            f"{what} is neither a readable file nor base64: give file:///path, "
            "data:;base64,<key> or a path"
        ) from None


class TokenAuthenticator:
    """Checks bearer tokens and tells whose they are."""

    def __init__(
        self,
        secret_key: bytes | None = None,
        public_key: bytes | None = None,
        role_claim: str = "sub",
    ) -> None:
        if (secret_key is None) == (public_key is None):
            raise WorkerConfigError(
                "token authentication needs exactly one of token_secret_key and token_public_key"
            )
        self._key: object = secret_key
        if public_key is not None:
            # Pulsar writes key pairs in binary (DER); PyJWT reads PEM by itself
            self._key = public_key if public_key.startswith(b"-----") else _der(public_key)
        self._algorithms = _SECRET_ALGORITHMS if secret_key is not None else _PUBLIC_ALGORITHMS
        self._role_claim = role_claim

    def role(self, authorization: str | None) -> str:
        """The role of an ``Authorization`` header's token; AuthenticationError if invalid."""
        if not authorization:
            raise AuthenticationError(
                "authentication required: send Authorization: Bearer <token> "
                "(magnetar --auth-token, or MAGNETAR_AUTH_TOKEN)"
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("the Authorization header must be 'Bearer <token>'")
        try:
            claims = jwt.decode(
                token.strip(),
                self._key,  # type: ignore[arg-type]  # bytes or a key object
                algorithms=self._algorithms,
                options={"verify_aud": False},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("the token has expired") from None
        except jwt.InvalidTokenError as error:
            raise AuthenticationError(f"invalid token: {error}") from None
        role = claims.get(self._role_claim)
        if not isinstance(role, str) or not role:
            raise AuthenticationError(f"the token has no {self._role_claim!r} claim naming a role")
        return role


def _der(public_key: bytes) -> object:
    try:
        return load_der_public_key(public_key)
    except ValueError:
        raise WorkerConfigError("token_public_key is neither a PEM nor a DER public key") from None


class TenantAdmins(Protocol):
    """Where tenants keep their admin roles (their TenantInfo's ``adminRoles``)."""

    def is_tenant_admin(self, tenant: str, role: str) -> bool:
        """Whether ``role`` is one of ``tenant``'s ``adminRoles`` (False: no such tenant)."""
        ...


class RoleAuthorizer:
    """What a role may do: everything (superusers) or its tenants' functions.

    An admin of a tenant is named by the worker's ``tenant_admin_roles`` or by the tenant's
    own ``adminRoles`` (asked of ``tenants``, the worker's tenancy)."""

    def __init__(
        self,
        superuser_roles: Iterable[str],
        tenant_admin_roles: Mapping[str, Iterable[str]],
        tenants: TenantAdmins | None = None,
    ) -> None:
        self._superusers = frozenset(superuser_roles)
        self._tenant_admins = {
            tenant: frozenset(roles) for tenant, roles in tenant_admin_roles.items()
        }
        self._tenants = tenants

    def is_superuser(self, role: str) -> bool:
        return role in self._superusers

    def require_superuser(self, role: str) -> None:
        if role not in self._superusers:
            raise AuthorizationError(f"role {role!r} is not a superuser: this needs a superuser")

    def require_tenant(self, role: str, tenant: str) -> None:
        """A superuser, or an admin of ``tenant``."""
        if role in self._superusers or role in self._tenant_admins.get(tenant, frozenset()):
            return
        if self._tenants is not None and self._tenants.is_tenant_admin(tenant, role):
            return
        raise AuthorizationError(f"role {role!r} may not manage functions of tenant {tenant!r}")


def create_token(
    secret_key: bytes, subject: str, expires_in_s: float | None = None, algorithm: str = "HS256"
) -> str:
    """A token for ``subject`` signed with ``secret_key`` (as ``pulsar tokens create``)."""
    claims: dict[str, object] = {"sub": subject}
    if expires_in_s is not None:
        claims["exp"] = int(time.time() + expires_in_s)
    return jwt.encode(claims, secret_key, algorithm=algorithm)


@dataclass(frozen=True)
class AdminAuth:
    """Who may use the admin API: token checks and role rules together."""

    authenticator: TokenAuthenticator
    authorizer: RoleAuthorizer
