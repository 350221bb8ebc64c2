"""Token authentication on the admin API: a 2-worker cluster whose keys and tokens come from
`magnetar tokens`, with a superuser and an admin of tenant ``acme``."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from playwright.sync_api import expect

from magnetar.broker import EmbeddedBroker, find_free_port
from magnetar.cli import main
from tests.cluster.conftest import Cluster, ConsolePages, Worker, wait_until
from tests.cluster.test_standalone import free_ports, ready
from tests.conftest import EXAMPLES, MAGNETAR


@dataclass
class Secured:
    cluster: Cluster
    leader: Worker
    follower: Worker
    tokens: dict[str, str]

    def call(
        self,
        method: str,
        path: str,
        role: str | None,
        worker: Worker | None = None,
        **kwargs: object,
    ) -> httpx.Response:
        headers: dict[str, str] = dict(kwargs.pop("headers", {}))  # type: ignore[call-overload]
        if role:
            headers["Authorization"] = f"Bearer {self.tokens[role]}"
        target = worker or self.follower
        return httpx.request(method, target.url + path, headers=headers, timeout=30, **kwargs)  # type: ignore[arg-type]


NOT_AUTHORIZED = {"reason": "Client is not authorized to perform operation"}


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output.strip()


@pytest.fixture(scope="module")
def secured(
    cluster_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("auth")
    key = root / "secret.key"
    _cli("tokens", "create-secret-key", "--output", str(key))
    tokens = {
        role: _cli("tokens", "create", "--secret-key", key.as_uri(), "--subject", role)
        for role in ("admin", "acme-admin", "stranger")
    }
    tokens["expired"] = _cli(
        "tokens", "create", "--secret-key", str(key), "--subject", "admin", "--expiry-time", "0s"
    )
    cluster = Cluster(
        cluster_broker.service_url,
        root,
        env={
            "MAGNETAR_AUTHENTICATION_ENABLED": "true",
            "MAGNETAR_TOKEN_SECRET_KEY": key.as_uri(),
            "MAGNETAR_SUPERUSER_ROLES": "admin",
            "MAGNETAR_TENANT_ADMIN_ROLES": json.dumps({"acme": ["acme-admin"]}),
        },
    )
    try:
        first = cluster.start_worker("a0")
        second = cluster.start_worker("a1")
        leader_id = httpx.get(
            f"{first.url}/admin/v2/worker/cluster/leader",
            headers={"Authorization": f"Bearer {tokens['admin']}"},
            timeout=10,
        ).json()["workerId"]
        leader, follower = (first, second) if leader_id == "a0" else (second, first)
        made = Secured(cluster, leader, follower, tokens)
        acme = {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
        tenant = made.call("PUT", "/admin/v2/tenants/acme", "admin", json=acme)
        assert tenant.status_code == 204, tenant.text
        namespace = made.call("PUT", "/admin/v2/namespaces/acme/prod", "acme-admin")
        assert namespace.status_code == 204, namespace.text
        yield made
    finally:
        cluster.stop_all()


def _create(secured: Secured, fqfn: str, role: str) -> httpx.Response:
    config = {"inputs": [f"in-{uuid.uuid4().hex[:6]}"]}
    return secured.call(
        "POST",
        f"/admin/v3/functions/{fqfn}",
        role,
        data={"functionConfig": json.dumps(config)},
        files={"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())},
    )


def test_requests_without_a_valid_token_get_401(secured: Secured) -> None:
    missing = secured.call("GET", "/admin/v3/functions/public/default", None)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["reason"].startswith("authentication required")
    garbage = secured.call(
        "GET", "/admin/v2/worker/cluster", None, headers={"Authorization": "Bearer not.a.jwt"}
    )
    assert garbage.status_code == 401 and garbage.json()["reason"].startswith("invalid token")
    expired = secured.call("GET", "/admin/v2/worker/cluster", "expired")
    assert expired.status_code == 401 and expired.json()["reason"] == "the token has expired"
    basic = secured.call(
        "GET", "/admin/v2/worker/cluster", None, headers={"Authorization": "Basic eDp5"}
    )
    assert basic.status_code == 401


def test_health_version_and_metrics_stay_open(secured: Secured) -> None:
    for path in ("/admin/v2/worker/cluster/leader/ready", "/version", "/metrics"):
        assert secured.call("GET", path, None).status_code == 200, path


def test_the_console_loads_without_a_token_and_calls_with_the_one_given(
    secured: Secured, console: ConsolePages
) -> None:
    assert secured.call("GET", "/console/", None).status_code == 200
    page = console.open(secured.follower)
    notice, summary = page.locator("#notice"), page.locator("#cluster-summary")
    expect(notice).to_contain_text(
        "This worker asks for a token: authentication required", timeout=30_000
    )
    page.locator("#token").fill(secured.tokens["acme-admin"])
    page.locator("#token-form button").click()
    expect(summary).to_have_text(
        "Cannot show the cluster: Client is not authorized to perform operation", timeout=30_000
    )
    # a tenant's admin may not list tenants: the console lists the deploy form's tenant
    assert _create(secured, "acme/prod/seen", "acme-admin").status_code == 204
    page.locator("#deploy-form [name=tenant]").fill("acme")
    expect(page.locator('tr[data-function="acme/prod/seen"]')).to_have_count(1, timeout=30_000)
    expect(notice).to_be_hidden()
    assert secured.call("DELETE", "/admin/v3/functions/acme/prod/seen", "admin").status_code == 204
    page.locator("#forget-token").click()
    page.locator("#token").fill(secured.tokens["admin"])
    page.locator("#token-form button").click()
    expect(summary).to_contain_text("2 workers · leader", timeout=30_000)
    expect(notice).to_be_hidden()


def test_superuser_may_do_everything(secured: Secured) -> None:
    created = _create(secured, "acme/prod/by-admin", "admin")  # forwarded to the leader
    assert created.status_code == 204, created.text
    assert secured.call("GET", "/admin/v3/functions/acme/prod", "admin").json() == ["by-admin"]
    assert secured.call("GET", "/admin/v2/worker/cluster", "admin").status_code == 200
    assert secured.call("PUT", "/admin/v2/worker/rebalance", "admin").status_code == 204
    status = secured.call("GET", "/admin/v3/functions/acme/prod/by-admin/status", "admin")
    assert status.status_code == 200
    deleted = secured.call("DELETE", "/admin/v3/functions/acme/prod/by-admin", "admin")
    assert deleted.status_code == 204


def test_a_tenant_admin_manages_its_own_tenant_only(secured: Secured) -> None:
    created = _create(secured, "acme/prod/mine", "acme-admin")  # through the non-leader
    assert created.status_code == 204, created.text
    wait_until(
        lambda: (
            secured.call("GET", "/admin/v3/functions/acme/prod/mine/status", "acme-admin").json()[
                "numRunning"
            ]
            == 1
        ),
        15,
        "acme function running",
    )
    updated = secured.call(
        "PUT",
        "/admin/v3/functions/acme/prod/mine",
        "acme-admin",
        data={"functionConfig": json.dumps({"parallelism": 2})},
    )
    assert updated.status_code == 204, updated.text
    stopped = secured.call("POST", "/admin/v3/functions/acme/prod/mine/stop", "acme-admin")
    assert stopped.status_code == 204

    # as Pulsar: a role that may not is 401, with its reason
    other = _create(secured, "public/default/theirs", "acme-admin")
    assert (other.status_code, other.json()) == (401, NOT_AUTHORIZED)
    worker_path = secured.call("GET", "/admin/v2/worker/assignments", "acme-admin")
    assert (worker_path.status_code, worker_path.json()) == (401, NOT_AUTHORIZED)
    drain = secured.call("PUT", "/admin/v2/worker/drain", "acme-admin")
    assert (drain.status_code, drain.json()) == (
        401,
        {"reason": "Client is not authorized to perform drain operation"},
    )
    stranger = secured.call("GET", "/admin/v3/functions/acme/prod/mine", "stranger")
    assert (stranger.status_code, stranger.json()) == (401, NOT_AUTHORIZED)
    deleted = secured.call("DELETE", "/admin/v3/functions/acme/prod/mine", "acme-admin")
    assert deleted.status_code == 204


def test_tenants_need_a_superuser_and_namespaces_an_admin_of_their_tenant(
    secured: Secured,
) -> None:
    info = {"adminRoles": [], "allowedClusters": ["standalone"]}
    refused = secured.call("PUT", "/admin/v2/tenants/rogue", "acme-admin", json=info)
    assert (refused.status_code, refused.json()) == (
        401,
        {"reason": "This operation requires super-user access"},
    )
    stranger = secured.call("PUT", "/admin/v2/namespaces/acme/dev", "stranger")
    assert (stranger.status_code, stranger.json()) == (
        401,
        {"reason": "Don't have permission to administrate resources on this tenant"},
    )
    made = secured.call("PUT", "/admin/v2/namespaces/acme/dev", "acme-admin")  # forwarded
    assert made.status_code == 204, made.text
    again = secured.call("PUT", "/admin/v2/namespaces/acme/dev", "acme-admin", secured.leader)
    assert (again.status_code, again.json()) == (409, {"reason": "Namespace already exists"})
    for worker in (secured.follower, secured.leader):
        listed = secured.call("GET", "/admin/v2/namespaces/acme", "acme-admin", worker)
        assert listed.json() == ["acme/dev", "acme/prod"]
    assert secured.call("DELETE", "/admin/v2/namespaces/acme/dev", "acme-admin").status_code == 204


def test_the_cli_sends_its_token(secured: Secured, tmp_path: Path) -> None:
    base = ["--admin-url", secured.follower.url]
    refused = CliRunner().invoke(main, [*base, "functions", "list", "--tenant", "acme"])
    assert refused.exit_code == 1
    assert "Reason: authentication required" in refused.output
    allowed = CliRunner().invoke(
        main,
        [
            *base,
            "--auth-token",
            secured.tokens["acme-admin"],
            "--output",
            "json",
            "functions",
            "list",
            "--tenant",
            "acme",
            "--namespace",
            "prod",
        ],
    )
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(allowed.output) == []
    from_env = CliRunner(env={"MAGNETAR_AUTH_TOKEN": secured.tokens["stranger"]}).invoke(
        main, [*base, "functions-worker", "get-cluster"]
    )
    assert from_env.exit_code == 1
    assert "Reason: Client is not authorized to perform operation" in from_env.output


def test_standalone_turns_authentication_on_from_its_config_file(tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    _cli("tokens", "create-secret-key", "--output", str(key))
    admin = _cli("tokens", "create", "--secret-key", str(key), "--subject", "root")
    settings = tmp_path / "worker.yaml"
    settings.write_text(
        f"authentication_enabled: true\ntoken_secret_key: {key.as_uri()}\nsuperuser_roles: [root]\n"
    )
    port = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            *MAGNETAR,
            "standalone",
            "--config",
            str(settings),
            "--http-port",
            str(port),
            "--broker-port",
            str(find_free_port()),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: ready(url), 60, "standalone ready")
        assert httpx.get(f"{url}/admin/v2/worker/cluster", timeout=10).status_code == 401
        allowed = httpx.get(
            f"{url}/admin/v2/worker/cluster",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=10,
        )
        assert allowed.status_code == 200 and allowed.json()[0]["workerId"] == "worker-1"
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(90)
