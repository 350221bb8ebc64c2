"""Tenants and namespaces from the broker's admin API: every call relayed as Pulsar's
``/admin/v2`` takes it, the broker's refusals passed on with its code and reason, and a
function registration checked as Pulsar's FunctionsImpl checks it.

The admin API is a fake behind ``httpx.MockTransport`` (the seam these tests own), answering
as Pulsar does; the real broker is in tests/docker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from magnetar.broker import find_free_port
from magnetar.worker.broker_admin import BrokerAdmin
from magnetar.worker.broker_tenancy import BrokerTenancy
from magnetar.worker.exceptions import BrokerAdminUnreachableError, RequestRefusedError


@dataclass
class FakeAdmin:
    """Pulsar's tenants and namespaces paths, in memory."""

    tenants: dict[str, Any] = field(
        default_factory=lambda: {"public": {"adminRoles": [], "allowedClusters": ["c1"]}}
    )
    namespaces: set[str] = field(default_factory=lambda: {"public/default"})
    calls: list[tuple[str, str, str, Any]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path.removeprefix("/admin/v2/")
        self.calls.append((request.method, path, request.url.query.decode(), body))
        parts = path.split("/")
        if parts == ["clusters"]:
            return httpx.Response(200, json=["c1"])
        if parts == ["tenants"]:
            return httpx.Response(200, json=sorted(self.tenants))
        if parts[0] == "tenants":
            return self._tenant(request.method, parts[1], body)
        if len(parts) == 2:
            if parts[1] not in self.tenants:
                return _refusal(404, "Tenant not found")
            listed = sorted(n for n in self.namespaces if n.startswith(parts[1] + "/"))
            return httpx.Response(200, json=listed)
        name = "/".join(parts[1:])
        if request.method == "PUT":
            if name in self.namespaces:
                return _refusal(409, "Namespace already exists")
            self.namespaces.add(name)
        else:
            self.namespaces.discard(name)
        return httpx.Response(204)

    def _tenant(self, method: str, tenant: str, body: Any) -> httpx.Response:
        if method == "GET":
            if tenant not in self.tenants:
                return _refusal(404, "Tenant does not exist")
            return httpx.Response(200, json=self.tenants[tenant])
        if method == "PUT" and tenant in self.tenants:
            return _refusal(409, "Tenant already exist")
        self.tenants[tenant] = body
        return httpx.Response(204)


def _refusal(status: int, reason: str) -> httpx.Response:
    return httpx.Response(status, json={"reason": reason})


@pytest.fixture
def fake() -> FakeAdmin:
    return FakeAdmin()


@pytest.fixture
def tenancy(fake: FakeAdmin) -> Iterator[BrokerTenancy]:
    admin = BrokerAdmin("http://pulsar.test:8080", transport=httpx.MockTransport(fake.handle))
    yield BrokerTenancy(admin)
    admin.close()


def test_reads_are_the_brokers(tenancy: BrokerTenancy) -> None:
    assert tenancy.clusters() == ["c1"]
    assert tenancy.tenants() == ["public"]
    assert tenancy.tenant("public") == {"adminRoles": [], "allowedClusters": ["c1"]}
    assert tenancy.namespaces("public") == ["public/default"]


def test_changes_are_relayed_as_sent(tenancy: BrokerTenancy, fake: FakeAdmin) -> None:
    info = {"adminRoles": ["ops"], "allowedClusters": ["c1"]}
    tenancy.create_tenant("acme", info, None)
    tenancy.create_namespace("acme/prod", {"bundles": {"numBundles": 2}}, None)
    tenancy.delete_namespace("acme/prod", True, None)
    assert fake.calls[-3:] == [
        ("PUT", "tenants/acme", "", info),
        ("PUT", "namespaces/acme/prod", "", {"bundles": {"numBundles": 2}}),
        ("DELETE", "namespaces/acme/prod", "force=true", None),
    ]


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [
        (lambda t: t.tenant("ghost"), 404, "Tenant does not exist"),
        (
            lambda t: t.create_tenant("public", {"allowedClusters": ["c1"]}, None),
            409,
            "Tenant already exist",
        ),
        (lambda t: t.namespaces("ghost"), 404, "Tenant not found"),
        (
            lambda t: t.create_namespace("public/default", None, None),
            409,
            "Namespace already exists",
        ),
        (lambda t: t.check_namespace("ghost", "default"), 400, "Tenant does not exist"),
        (lambda t: t.check_namespace("public", "ghost"), 400, "Namespace does not exist"),
    ],
)
def test_refusals_keep_the_brokers_code_and_reason(
    tenancy: BrokerTenancy, call: Any, status: int, reason: str
) -> None:
    with pytest.raises(RequestRefusedError) as refused:
        call(tenancy)
    assert (refused.value.status_code, refused.value.reason) == (status, reason)


def test_tenant_admins_are_the_brokers_admin_roles(tenancy: BrokerTenancy, fake: FakeAdmin) -> None:
    tenancy.create_tenant("acme", {"adminRoles": ["acme-admin"], "allowedClusters": ["c1"]}, None)
    assert tenancy.is_tenant_admin("acme", "acme-admin")
    assert not tenancy.is_tenant_admin("acme", "beta-admin")
    assert not tenancy.is_tenant_admin("ghost", "acme-admin")
    # asked each time: a role the broker takes away is no admin at once
    tenancy.update_tenant("acme", {"adminRoles": [], "allowedClusters": ["c1"]}, None)
    assert not tenancy.is_tenant_admin("acme", "acme-admin")


def test_a_namespace_that_exists_passes_the_registration_check(tenancy: BrokerTenancy) -> None:
    tenancy.check_namespace("public", "default")


def test_an_unreachable_broker_is_named() -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    admin = BrokerAdmin(url, timeout_s=2)
    try:
        with pytest.raises(BrokerAdminUnreachableError, match=f"admin API at {url} cannot be"):
            BrokerTenancy(admin).tenants()
    finally:
        admin.close()
