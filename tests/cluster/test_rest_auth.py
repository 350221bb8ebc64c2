"""Token authentication on the admin API: a 2-worker cluster whose keys and tokens come from
`magnetar tokens`, with a superuser and tenants ``acme`` and ``beta``, each with an admin of
its own from its ``adminRoles`` (and ``beta-ops``, a beta admin by the worker's config)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pulsar
import pytest
from click.testing import CliRunner
from playwright.sync_api import expect

from magnetar.broker import find_free_port
from magnetar.cli import main
from magnetar.worker.cluster_key import ClusterKey, PeerSeal
from magnetar.worker.functions import FORWARD_PATH
from tests.cluster.conftest import Cluster, ConsolePages, Worker, wait_until, worker_env
from tests.cluster.test_standalone import free_ports, ready
from tests.conftest import EXAMPLES, MAGNETAR, Broker


@dataclass
class Secured:
    cluster: Cluster
    leader: Worker
    follower: Worker
    tokens: dict[str, str]
    cluster_key: Path

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
def secured(cluster_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("auth")
    key = root / "secret.key"
    _cli("tokens", "create-secret-key", "--output", str(key))
    tokens = {
        role: _cli("tokens", "create", "--secret-key", key.as_uri(), "--subject", role)
        for role in ("admin", "acme-admin", "beta-admin", "beta-ops", "gamma-admin", "stranger")
    }
    cluster_key = root / "cluster.key"
    _cli("tokens", "create-secret-key", "--output", str(cluster_key))
    tokens["expired"] = _cli(
        "tokens", "create", "--secret-key", str(key), "--subject", "admin", "--expiry-time", "0s"
    )
    cluster = Cluster(
        cluster_broker.service_url,
        root,
        env={
            **worker_env(cluster_broker),
            "MAGNETAR_AUTHENTICATION_ENABLED": "true",
            "MAGNETAR_TOKEN_SECRET_KEY": key.as_uri(),
            "MAGNETAR_CLUSTER_KEY": cluster_key.as_uri(),
            "MAGNETAR_SUPERUSER_ROLES": "admin",
            "MAGNETAR_TENANT_ADMIN_ROLES": json.dumps({"beta": ["beta-ops"]}),
        },
    )
    try:
        first = cluster.start_worker("a0")
        second = cluster.start_worker("a1")
        # On Apache Pulsar a joining worker may take the coordination subscription (its
        # Failover consumer is picked by a hash ring there), and with it the leadership a
        # couple of heartbeats later: the tests here name the leader, so it must be settled.
        leader_id = _settled_leader(first, second, tokens["admin"])
        leader, follower = (first, second) if leader_id == "a0" else (second, first)
        made = Secured(cluster, leader, follower, tokens, cluster_key)
        for tenant in ("acme", "beta"):
            info = {"adminRoles": [f"{tenant}-admin"], "allowedClusters": ["standalone"]}
            made_tenant = made.call("PUT", f"/admin/v2/tenants/{tenant}", "admin", json=info)
            assert made_tenant.status_code == 204, made_tenant.text
            # by the tenant's own admin: one from its adminRoles
            namespace = made.call("PUT", f"/admin/v2/namespaces/{tenant}/prod", f"{tenant}-admin")
            assert namespace.status_code == 204, namespace.text
        yield made
    finally:
        cluster.stop_all()


def _settled_leader(first: Worker, second: Worker, token: str) -> str:
    """The leader both workers name, once they have named the same one for 3 s."""
    agreed_since, leader = time.monotonic(), ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        named = {
            httpx.get(
                f"{worker.url}/admin/v2/worker/cluster/leader",
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
            .json()
            .get("workerId", "")  # none, while a new leader takes over
            for worker in (first, second)
        }
        if len(named) != 1 or leader not in named:
            agreed_since, leader = time.monotonic(), named.pop() if len(named) == 1 else ""
        elif leader and time.monotonic() - agreed_since >= 3:
            return leader
        time.sleep(0.2)
    raise AssertionError("the workers did not settle on one leader within 60 s")


def _topic(fqfn: str, name: str) -> str:
    """A topic of the function's namespace."""
    return f"persistent://{fqfn.rsplit('/', 1)[0]}/{name}-{uuid.uuid4().hex[:6]}"


def _create(
    secured: Secured,
    fqfn: str,
    role: str,
    code: Path = EXAMPLES / "exclamation.py",
    **config: object,
) -> httpx.Response:
    """Register ``fqfn`` as ``role``: the example reading a topic of its own namespace,
    unless ``config`` says otherwise."""
    config = {"inputs": [_topic(fqfn, "in")], **config}
    return secured.call(
        "POST",
        f"/admin/v3/functions/{fqfn}",
        role,
        data={"functionConfig": json.dumps(config)},
        files={"data": (code.name, code.read_bytes())},
    )


def _update(secured: Secured, fqfn: str, role: str, **config: object) -> httpx.Response:
    return secured.call(
        "PUT",
        f"/admin/v3/functions/{fqfn}",
        role,
        data={"functionConfig": json.dumps(config)},
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


def test_internal_paths_refuse_every_token_and_take_the_workers_own_calls(
    secured: Secured,
) -> None:
    created = _create(secured, "acme/prod/target", "acme-admin")
    assert created.status_code == 204, created.text
    change = json.dumps({"op": "delete", "fqfn": "acme/prod/target"}).encode()
    json_body = {"Content-Type": "application/json"}
    for role in ("acme-admin", "admin"):
        refused = secured.call("POST", FORWARD_PATH, role, secured.leader, content=change)
        assert refused.status_code == 401, role
        assert refused.json() == {
            "reason": f"{FORWARD_PATH} is for the cluster's workers only: a token cannot call it"
        }
    assert secured.call("GET", "/admin/v3/functions/acme/prod/target", "admin").status_code == 200

    # a worker's call (what a follower sends the leader) with the caller's token along
    seal = PeerSeal(ClusterKey.from_setting(secured.cluster_key.as_uri()), "a1")
    sealed = json_body | seal.headers("POST", FORWARD_PATH, change)
    stranger = secured.call(
        "POST", FORWARD_PATH, "stranger", secured.leader, content=change, headers=sealed
    )
    assert (stranger.status_code, stranger.json()) == (401, NOT_AUTHORIZED)
    accepted = secured.call(
        "POST", FORWARD_PATH, "acme-admin", secured.leader, content=change, headers=sealed
    )
    assert accepted.status_code == 200, accepted.text
    gone = secured.call("GET", "/admin/v3/functions/acme/prod/target", "admin", secured.leader)
    assert gone.status_code == 404


SNOOP = """
import os


def process(input, context):
    names = ("MAGNETAR_CLUSTER_KEY", "MAGNETAR_TOKEN_SECRET_KEY")
    return ",".join(f"{name}={os.environ.get(name, '')}" for name in names)
"""


def test_an_instance_does_not_inherit_the_workers_secret_settings(
    secured: Secured, cluster_client: pulsar.Client, tmp_path: Path
) -> None:
    code = tmp_path / "snoop.py"
    code.write_text(SNOOP)
    suffix = uuid.uuid4().hex[:6]
    config = {
        "inputs": [f"persistent://acme/prod/snoop-in-{suffix}"],
        "output": f"persistent://acme/prod/snoop-out-{suffix}",
    }
    created = secured.call(
        "POST",
        "/admin/v3/functions/acme/prod/snoop",
        "acme-admin",
        data={"functionConfig": json.dumps(config)},
        files={"data": ("snoop.py", code.read_bytes())},
    )
    assert created.status_code == 204, created.text
    consumer = cluster_client.subscribe(
        f"persistent://acme/prod/snoop-out-{suffix}",
        "t",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = cluster_client.create_producer(f"persistent://acme/prod/snoop-in-{suffix}")
    try:
        deadline = time.monotonic() + 30
        while True:  # until the instance runs
            producer.send(b"x")
            try:
                seen = consumer.receive(1000).data().decode()
                break
            except pulsar.Timeout:
                assert time.monotonic() < deadline, "the function gave no output"
    finally:
        producer.close()
        consumer.close()
        secured.call("DELETE", "/admin/v3/functions/acme/prod/snoop", "acme-admin")
    assert seen == "MAGNETAR_CLUSTER_KEY=,MAGNETAR_TOKEN_SECRET_KEY="


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
        # the workers' key, made once for them, readable by their user only
        assert (tmp_path / "data" / "cluster.key").stat().st_mode & 0o777 == 0o600
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(90)


def _admin_cli(secured: Secured, role: str, *args: str) -> str:
    return _cli("--admin-url", secured.follower.url, "--auth-token", secured.tokens[role], *args)


@pytest.mark.brokers("lite", "apache")
def test_tenant_admins_are_the_tenants_admin_roles_and_the_configs(secured: Secured) -> None:
    _admin_cli(secured, "admin", "tenants", "create", "gamma", "--admin-roles", "gamma-admin")
    made = secured.call("PUT", "/admin/v2/namespaces/gamma/dev", "gamma-admin")
    assert made.status_code == 204, made.text
    listed = secured.call("GET", "/admin/v3/functions/gamma/dev", "gamma-admin", secured.leader)
    assert (listed.status_code, listed.json()) == (200, [])
    refused = secured.call("GET", "/admin/v3/functions/gamma/dev", "acme-admin")
    assert (refused.status_code, refused.json()) == (401, NOT_AUTHORIZED)
    # beta-ops: a beta admin by the worker's tenant_admin_roles, beta's adminRoles aside
    by_config = secured.call("GET", "/admin/v3/functions/beta/prod", "beta-ops")
    assert by_config.status_code == 200, by_config.text

    # an admin role taken away is no admin any more, on either worker
    _admin_cli(secured, "admin", "tenants", "update", "gamma", "--admin-roles", "someone-else")
    for worker in (secured.follower, secured.leader):
        gone = secured.call("GET", "/admin/v3/functions/gamma/dev", "gamma-admin", worker)
        assert (gone.status_code, gone.json()) == (401, NOT_AUTHORIZED)
    assert secured.call("DELETE", "/admin/v2/namespaces/gamma/dev", "admin").status_code == 204
    assert secured.call("DELETE", "/admin/v2/tenants/gamma", "admin").status_code == 204


def _unauthorized(operation: str, topic: str) -> dict[str, str]:
    """Pulsar's refusal of a topic operation."""
    return {
        "reason": f"Unauthorized to validateTopicOperation for operation [{operation}] on "
        f"topic [{topic}]"
    }


@pytest.mark.brokers("lite", "apache")
def test_a_tenants_function_names_only_the_tenants_topics(secured: Secured) -> None:
    theirs = _topic("beta/prod/x", "in")
    for config, refusal in [
        ({"inputs": [theirs]}, _unauthorized("CONSUME", theirs)),
        (
            {"inputs": [], "topicsPattern": "persistent://beta/prod/.*"},
            _unauthorized("CONSUME", "persistent://beta/prod/.*"),
        ),
        ({"inputs": ["in"]}, _unauthorized("CONSUME", "persistent://public/default/in")),
        ({"output": theirs}, _unauthorized("PRODUCE", theirs)),
        ({"logTopic": theirs}, _unauthorized("PRODUCE", theirs)),
        (
            {"deadLetterTopic": theirs, "maxMessageRetries": 2},
            _unauthorized("PRODUCE", theirs),
        ),
    ]:
        answer = _create(secured, "acme/prod/reach", "acme-admin", **config)
        assert (answer.status_code, answer.json()) == (401, refusal), config
    assert secured.call("GET", "/admin/v3/functions/acme/prod", "acme-admin").json() == []

    # its own topics are fine, but an update may not reach out either
    own = _create(secured, "acme/prod/own", "acme-admin", output=_topic("acme/prod/x", "out"))
    assert own.status_code == 204, own.text
    out = _update(secured, "acme/prod/own", "acme-admin", output=theirs)
    assert (out.status_code, out.json()) == (401, _unauthorized("PRODUCE", theirs))

    # a superuser may bridge tenants; the tenant's admin may then not change that function
    bridge = _create(secured, "acme/prod/bridge", "admin", inputs=[theirs])
    assert bridge.status_code == 204, bridge.text
    changed = _update(secured, "acme/prod/bridge", "acme-admin", parallelism=2)
    assert (changed.status_code, changed.json()) == (401, _unauthorized("CONSUME", theirs))
    for name in ("own", "bridge"):
        gone = secured.call("DELETE", f"/admin/v3/functions/acme/prod/{name}", "admin")
        assert gone.status_code == 204


@pytest.mark.brokers("lite", "apache")
def test_not_even_a_superuser_names_a_topic_of_the_system_namespace(secured: Secured) -> None:
    system = f"public/{secured.cluster.namespace}"  # the cluster's system namespace
    metadata = f"persistent://{system}/metadata"
    answer = _create(secured, "acme/prod/spy", "admin", inputs=[metadata])
    assert answer.status_code == 400
    assert answer.json()["reason"] == (
        f"inputs names {metadata}, a topic of the system namespace {system}: no function may "
        "consume from or produce to the functions worker's own topics"
    )


def test_the_leaders_internal_path_validates_a_forwarded_change(secured: Secured) -> None:
    """Even a change a worker seals (what a follower forwards with its caller's token) is
    checked by the leader as if it had come to it directly."""
    system = f"public/{secured.cluster.namespace}"
    seal = PeerSeal(ClusterKey.from_setting(secured.cluster_key.as_uri()), "a1")

    def forward(fqfn: str, **config: object) -> httpx.Response:
        tenant, namespace, name = fqfn.split("/")
        body = {
            "op": "register",
            "fqfn": fqfn,
            "config": {"tenant": tenant, "namespace": namespace, "name": name, "py": "f.py"}
            | config,
            "package": None,
        }
        content = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} | seal.headers("POST", FORWARD_PATH, content)
        return secured.call(
            "POST", FORWARD_PATH, "acme-admin", secured.leader, content=content, headers=headers
        )

    spy = forward("acme/prod/spy", inputs=[f"persistent://{system}/assignments"])
    assert spy.status_code == 400 and "system namespace" in spy.json()["reason"]
    theirs = _topic("beta/prod/x", "in")
    reach = forward("acme/prod/reach", inputs=[theirs])
    assert (reach.status_code, reach.json()) == (401, _unauthorized("CONSUME", theirs))
    other = forward("beta/prod/mine", inputs=[theirs])
    assert (other.status_code, other.json()) == (401, NOT_AUTHORIZED)
    smuggled = forward("acme/prod/smuggled", inputs=[theirs], tenant="beta")
    assert smuggled.status_code == 400
    assert smuggled.json()["reason"].startswith("malformed function change")
    tenancy = secured.call(
        "POST",
        "/admin/v2/worker/internal/tenancy-changes",
        "acme-admin",
        secured.leader,
        json={"op": "delete_namespace", "name": "beta/prod"},
    )
    assert tenancy.status_code == 401
    assert secured.call("GET", "/admin/v3/functions/acme/prod", "admin").json() == []


@pytest.mark.brokers("lite", "apache")
def test_another_tenants_functions_namespaces_and_tenant_are_out_of_reach(
    secured: Secured,
) -> None:
    made = _create(secured, "beta/prod/private", "beta-admin", output=_topic("beta/prod/x", "out"))
    assert made.status_code == 204, made.text
    fn = "/admin/v3/functions/beta/prod/private"
    state = {"state": (None, json.dumps({"key": "k", "stringValue": "stolen"}))}
    attempts: list[tuple[str, str, dict[str, object]]] = [
        ("GET", fn, {}),
        ("GET", f"{fn}/status", {}),
        ("GET", f"{fn}/stats", {}),
        ("GET", f"{fn}/0/status", {}),
        ("GET", f"{fn}/0/stats", {}),
        ("GET", f"{fn}/state/k", {}),
        ("POST", f"{fn}/state/k", {"files": state}),
        ("POST", f"{fn}/trigger", {"data": {"data": "x"}}),
        ("GET", f"{fn}/download", {}),
        ("PUT", fn, {"data": {"functionConfig": json.dumps({"parallelism": 2})}}),
        ("POST", f"{fn}/restart", {}),
        ("POST", f"{fn}/0/restart", {}),
        ("POST", f"{fn}/stop", {}),
        ("POST", f"{fn}/start", {}),
        ("DELETE", fn, {}),
        ("GET", "/admin/v3/functions/beta/prod", {}),
    ]
    for method, path, kwargs in attempts:
        for worker in (secured.follower, secured.leader):
            answer = secured.call(method, path, "acme-admin", worker, **kwargs)
            assert (answer.status_code, answer.json()) == (401, NOT_AUTHORIZED), (method, path)
    namespaces = {"reason": "Don't have permission to administrate resources on this tenant"}
    for method, path in [
        ("GET", "/admin/v2/namespaces/beta"),
        ("PUT", "/admin/v2/namespaces/beta/evil"),
        ("DELETE", "/admin/v2/namespaces/beta/prod"),
    ]:
        answer = secured.call(method, path, "acme-admin")
        assert (answer.status_code, answer.json()) == (401, namespaces), (method, path)
    super_user = {"reason": "This operation requires super-user access"}
    takeover = {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
    for method, kwargs in [("GET", {}), ("POST", {"json": takeover}), ("DELETE", {})]:
        answer = secured.call(method, "/admin/v2/tenants/beta", "acme-admin", **kwargs)
        assert (answer.status_code, answer.json()) == (401, super_user), method
    # untouched: beta's function, its state, its tenant
    assert secured.call("GET", fn, "beta-admin").status_code == 200
    assert secured.call("GET", f"{fn}/state/k", "beta-admin").status_code == 404
    info = secured.call("GET", "/admin/v2/tenants/beta", "admin").json()
    assert info["adminRoles"] == ["beta-admin"]
    assert secured.call("DELETE", fn, "beta-admin").status_code == 204


SECRET_FUNCTION = """
from pulsar import Function


class Reveal(Function):
    def process(self, input, context):
        return f"{input}:{context.get_secret('password')}"
"""


@pytest.mark.brokers("lite", "apache")
def test_functions_get_shows_secret_names_not_values(secured: Secured, tmp_path: Path) -> None:
    code = tmp_path / "reveal.py"
    code.write_text(SECRET_FUNCTION)
    fqfn = "beta/prod/reveal"
    made = _create(
        secured,
        fqfn,
        "beta-admin",
        code,
        className="reveal.Reveal",
        output=_topic(fqfn, "out"),
        secrets={"password": "hunter2"},
    )
    assert made.status_code == 204, made.text
    shown = secured.call("GET", f"/admin/v3/functions/{fqfn}", "beta-admin")
    assert shown.json()["secrets"] == {"password": "******"}
    assert "hunter2" not in shown.text

    def revealed() -> bool:
        answer = secured.call(
            "POST", f"/admin/v3/functions/{fqfn}/trigger", "beta-admin", data={"data": "x"}
        )
        return answer.status_code == 200 and answer.text == "x:hunter2"

    wait_until(revealed, 60, "the instance receives the secret's value")
    # the config as shown, sent back: the secret keeps its value
    sent_back = _update(
        secured, fqfn, "beta-admin", secrets=shown.json()["secrets"], timeoutMs=9000
    )
    assert sent_back.status_code == 204, sent_back.text
    wait_until(revealed, 60, "the secret survives an update that sends the mask back")
    assert secured.call("DELETE", f"/admin/v3/functions/{fqfn}", "beta-admin").status_code == 204
