"""Token checks and role rules, with real keys (HS256 secrets and RS256 key pairs)."""

from __future__ import annotations

import base64
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from magnetar.worker.auth import RoleAuthorizer, TokenAuthenticator, create_token, read_key
from magnetar.worker.config import load_worker_config
from magnetar.worker.exceptions import (
    AuthenticationError,
    AuthorizationError,
    WorkerConfigError,
)

SECRET = b"0123456789abcdef0123456789abcdef"


def test_a_token_made_with_the_secret_key_names_its_role() -> None:
    authenticator = TokenAuthenticator(secret_key=SECRET)
    assert authenticator.role(f"Bearer {create_token(SECRET, 'ops')}") == "ops"
    assert authenticator.role(f"bearer  {create_token(SECRET, 'ops', 3600)}") == "ops"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "authentication required"),
        ("Basic eDp5", "the Authorization header must be 'Bearer <token>'"),
        ("Bearer ", "the Authorization header must be 'Bearer <token>'"),
        ("Bearer abc", "invalid token"),
        (f"Bearer {create_token(b'another-key-another-key-another-k', 'ops')}", "invalid token"),
        (f"Bearer {create_token(SECRET, 'ops', -10)}", "the token has expired"),
        (f"Bearer {jwt.encode({'role': 'ops'}, SECRET)}", "the token has no 'sub' claim"),
    ],
)
def test_bad_tokens_are_refused_with_the_reason(header: str | None, reason: str) -> None:
    with pytest.raises(AuthenticationError, match=reason):
        TokenAuthenticator(secret_key=SECRET).role(header)


def test_rs256_tokens_check_against_a_der_or_pem_public_key() -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode({"sub": "ci"}, private, algorithm="RS256")
    public = private.public_key()
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for key in (der, pem):
        assert TokenAuthenticator(public_key=key).role(f"Bearer {token}") == "ci"
    with pytest.raises(AuthenticationError, match="invalid token"):
        TokenAuthenticator(public_key=der).role(f"Bearer {create_token(SECRET, 'ci')}")
    with pytest.raises(WorkerConfigError, match="neither a PEM nor a DER public key"):
        TokenAuthenticator(public_key=b"garbage")


def test_keys_are_read_as_pulsar_writes_them(tmp_path: Path) -> None:
    raw = tmp_path / "secret.key"
    raw.write_bytes(SECRET)
    encoded = base64.b64encode(SECRET).decode()
    assert read_key(raw.as_uri()) == SECRET
    assert read_key(str(raw)) == SECRET
    assert read_key(f"data:;base64,{encoded}") == SECRET
    assert read_key(encoded) == SECRET
    with pytest.raises(WorkerConfigError, match="cannot read the key file"):
        read_key((tmp_path / "missing.key").as_uri())
    with pytest.raises(WorkerConfigError, match="neither a readable file nor base64"):
        read_key("not base64 and not a file!")


def test_superusers_do_everything_and_tenant_admins_their_tenants() -> None:
    roles = RoleAuthorizer(["root"], {"acme": ["acme-ops"], "beta": ["beta-ops", "acme-ops"]})
    roles.require_superuser("root")
    roles.require_tenant("root", "anything")
    roles.require_tenant("acme-ops", "acme")
    roles.require_tenant("acme-ops", "beta")
    with pytest.raises(AuthorizationError, match="may not manage functions of tenant 'acme'"):
        roles.require_tenant("beta-ops", "acme")
    with pytest.raises(AuthorizationError, match="is not a superuser"):
        roles.require_superuser("acme-ops")


def test_worker_config_reads_auth_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MAGNETAR_AUTHENTICATION_ENABLED", "true")
    monkeypatch.setenv("MAGNETAR_TOKEN_SECRET_KEY", "data:;base64,AAAA")
    monkeypatch.setenv("MAGNETAR_SUPERUSER_ROLES", "root, ops")
    monkeypatch.setenv("MAGNETAR_TENANT_ADMIN_ROLES", '{"acme": ["acme-ops"]}')
    with pytest.raises(WorkerConfigError, match="authentication_enabled needs cluster_key"):
        load_worker_config()
    monkeypatch.setenv("MAGNETAR_CLUSTER_KEY", "data:;base64," + "A" * 44)
    config = load_worker_config()
    assert config.superuser_roles == ("root", "ops")
    assert config.tenant_admin_roles == {"acme": ("acme-ops",)}
    monkeypatch.delenv("MAGNETAR_TOKEN_SECRET_KEY")
    with pytest.raises(WorkerConfigError, match="needs exactly one of token_secret_key"):
        load_worker_config()
    monkeypatch.setenv("MAGNETAR_TOKEN_SECRET_KEY", "data:;base64,AAAA")
    monkeypatch.setenv("MAGNETAR_TENANT_ADMIN_ROLES", "acme=ops")
    with pytest.raises(WorkerConfigError, match=r"tenant_admin_roles: .*must be JSON"):
        load_worker_config()


class _TenantInfos:
    """Tenants' adminRoles, as a tenancy keeps them."""

    def __init__(self, admin_roles: dict[str, list[str]]) -> None:
        self.admin_roles = admin_roles

    def is_tenant_admin(self, tenant: str, role: str) -> bool:
        return role in self.admin_roles.get(tenant, [])


def test_tenant_admins_are_the_tenants_admin_roles_and_the_configs() -> None:
    tenants = _TenantInfos({"acme": ["acme-admin"], "beta": ["beta-admin"]})
    roles = RoleAuthorizer(["root"], {"beta": ["beta-ops"]}, tenants)
    roles.require_tenant("acme-admin", "acme")
    roles.require_tenant("beta-admin", "beta")
    roles.require_tenant("beta-ops", "beta")  # the config adds to beta's adminRoles
    for role, tenant in [("acme-admin", "beta"), ("beta-ops", "acme"), ("beta-admin", "acme")]:
        with pytest.raises(
            AuthorizationError, match=f"may not manage functions of tenant '{tenant}'"
        ):
            roles.require_tenant(role, tenant)
    tenants.admin_roles["acme"] = []
    with pytest.raises(AuthorizationError):
        roles.require_tenant("acme-admin", "acme")
    assert roles.is_superuser("root") and not roles.is_superuser("acme-admin")
