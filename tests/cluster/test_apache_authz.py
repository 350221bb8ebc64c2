"""The hostile tenant on Apache Pulsar with authentication and authorization on: the broker
(one standalone for the module, tokens signed with one key) authorizes each topic operation
by role, the worker connects with a superuser role of its own, and each instance with the
token its function was submitted with. Tenants ``acme`` and ``beta`` have their admins from
their ``adminRoles``. What Magnetar checks is refused here as on pulsar-lite; what function
code does with a broker client of its own, the broker refuses."""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from magnetar.broker_probe import ASKS_FOR_AUTHENTICATION, server_version
from magnetar.statestore import journal_topic
from magnetar.testing import ApachePulsarError, ApachePulsarStandalone, TokenAuthorization
from magnetar.worker.function_auth import TOKEN_AUTH_PLUGIN
from magnetar.worker.functions import FORWARD_PATH
from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.cluster.test_rest_auth import NOT_AUTHORIZED, _cli
from tests.conftest import EXAMPLES, KEEP_ALIVE_S
from tests.integration.conftest import collect, produce

pytestmark = pytest.mark.brokers("apache")

WORKER_ROLE = "magnetar-worker"
TENANTS = ("acme", "beta")

HOSTILE = """
import gc
import json

import pulsar
from pulsar import Function


def attempt(action):
    try:
        result = action()
    except Exception as error:
        return f"refused: {type(error).__name__}"
    return f"allowed: {result}"


def send(client, topic):
    producer = client.create_producer(topic)
    try:
        producer.send(b"forged", properties={"type": "function", "fqfn": "beta/prod/victim"})
    finally:
        producer.close()
    return "sent"


def read(client, topic):
    client.create_reader(topic, pulsar.MessageId.earliest).close()
    return "opened"


class Hostile(Function):
    def process(self, input, context):
        probe = json.loads(input)
        # the instance's own client, with the function's credentials
        mine = next(o for o in gc.get_objects() if isinstance(o, pulsar.Client))
        report = {
            f"send {name}": attempt(lambda topic=topic: send(mine, topic))
            for name, topic in probe["send"].items()
        }
        report.update({
            f"read {name}": attempt(lambda topic=topic: read(mine, topic))
            for name, topic in probe["read"].items()
        })
        anonymous = pulsar.Client(probe["service_url"], operation_timeout_seconds=3)
        try:
            report["anonymous client"] = attempt(lambda: send(anonymous, probe["own_topic"]))
        finally:
            anonymous.close()
        report["context.publish other tenant"] = attempt(
            lambda: context.publish(probe["send"]["other tenant"], "x")
        )
        return json.dumps(report)
"""


@dataclass
class Authz:
    pulsar: ApachePulsarStandalone
    cluster: Cluster
    worker: Worker
    tokens: dict[str, str]
    client: pulsar.Client
    """A superuser's client, for the tests' own inputs and outputs."""

    def call(self, method: str, path: str, role: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.request(method, self.worker.url + path, headers=headers, timeout=30, **kwargs)

    def system_topic(self, name: str) -> str:
        return f"persistent://public/{self.cluster.namespace}/{name}"

    def create(self, fqfn: str, role: str, code: Path, **config: object) -> httpx.Response:
        namespace = fqfn.rsplit("/", 1)[0]
        config = {"inputs": [f"persistent://{namespace}/in-{uuid.uuid4().hex[:8]}"], **config}
        return self.call(
            "POST",
            f"/admin/v3/functions/{fqfn}",
            role,
            data={"functionConfig": json.dumps(config)},
            files={"data": (code.name, code.read_bytes())},
        )

    def running(self, fqfn: str, role: str) -> str:
        """Wait until ``fqfn`` runs; its input topic."""
        wait_until(
            lambda: (
                self.call("GET", f"/admin/v3/functions/{fqfn}/status", role).json()["numRunning"]
                == 1
            ),
            30,
            f"{fqfn} running",
        )
        record = self.call("GET", f"/admin/v3/functions/{fqfn}", role).json()
        return str(record["inputs"][0])


def _private_file(path: Path, content: bytes) -> Path:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
    return path


@pytest.fixture(scope="module")
def authz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Authz]:
    root = tmp_path_factory.mktemp("authz")
    authorization = TokenAuthorization(secrets.token_bytes(32), ("admin", WORKER_ROLE))
    broker = ApachePulsarStandalone(
        root / "pulsar", keep_alive_s=KEEP_ALIVE_S, quick_start=True, authorization=authorization
    )
    try:
        broker.start()
    except ApachePulsarError as error:
        pytest.fail(f"{error}\n(`pytest --brokers lite` runs without it)", pytrace=False)
    cluster: Cluster | None = None
    client: pulsar.Client | None = None
    try:
        tokens = {role: authorization.token(role) for role in ("admin", "acme-admin", "beta-admin")}
        for tenant in TENANTS:
            info = {"adminRoles": [f"{tenant}-admin"], "allowedClusters": ["standalone"]}
            assert broker.admin("PUT", f"/admin/v2/tenants/{tenant}", json=info).is_success
            # nothing granted: a tenant admin may produce and consume on its tenant's topics
            assert broker.admin("PUT", f"/admin/v2/namespaces/{tenant}/prod").is_success
        # the worker checks tokens with the broker's key, as the functions workers of a
        # cluster do; its own token is a superuser's of the broker
        key = _private_file(root / "secret.key", authorization.secret_key)
        worker_token = _private_file(
            root / "worker.token", authorization.token(WORKER_ROLE).encode()
        )
        cluster_key = root / "cluster.key"
        _cli("tokens", "create-secret-key", "--output", str(cluster_key))
        cluster = Cluster(
            broker.service_url,
            root,
            env={
                "MAGNETAR_PULSAR_ADMIN_URL": broker.admin_url,
                "MAGNETAR_AUTHENTICATION_ENABLED": "true",
                "MAGNETAR_TOKEN_SECRET_KEY": key.as_uri(),
                "MAGNETAR_CLUSTER_KEY": cluster_key.as_uri(),
                "MAGNETAR_SUPERUSER_ROLES": "admin",
                "MAGNETAR_BROKER_CLIENT_AUTHENTICATION_PLUGIN": TOKEN_AUTH_PLUGIN,
                "MAGNETAR_BROKER_CLIENT_AUTHENTICATION_PARAMETERS": worker_token.as_uri(),
            },
        )
        worker = cluster.start_worker("z0")
        client = pulsar.Client(
            broker.service_url,
            authentication=pulsar.AuthenticationToken(tokens["admin"]),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            operation_timeout_seconds=10,
        )
        yield Authz(broker, cluster, worker, tokens, client)
    finally:
        if cluster is not None:
            cluster.stop_all()
        if client is not None:
            client.close()
        broker.stop()


def test_a_function_works_on_its_own_tenants_topics_with_its_own_role(authz: Authz) -> None:
    output = f"persistent://acme/prod/out-{uuid.uuid4().hex[:8]}"
    created = authz.create(
        "acme/prod/shout", "acme-admin", EXAMPLES / "exclamation.py", output=output
    )
    assert created.status_code == 204, created.text
    source = authz.running("acme/prod/shout", "acme-admin")

    produce(authz.client, source, ["hello"])

    (message,) = collect(authz.client, output, 1, timeout=30)
    assert message.data() == b"hello!"
    # the broker asks for credentials, so it is no pulsar-lite: the instance's client went
    # straight to its topics (no consumer-id spread refused in its log)
    assert server_version(authz.pulsar.service_url) == ASKS_FOR_AUTHENTICATION
    log = authz.call("GET", "/admin/v3/functions/acme/prod/shout/0/logs", "acme-admin")
    assert log.status_code == 200, log.text
    assert "ERROR" not in log.text, log.text


def test_a_topics_pattern_of_its_own_namespace_is_listed_with_its_own_role(
    authz: Authz,
) -> None:
    prefix = f"persistent://acme/prod/pat{uuid.uuid4().hex[:6]}"
    produce(authz.client, f"{prefix}-a", ["one"])  # there before the function subscribes
    output = f"persistent://acme/prod/out-{uuid.uuid4().hex[:8]}"
    created = authz.create(
        "acme/prod/pattern",
        "acme-admin",
        EXAMPLES / "exclamation.py",
        inputs=[],
        topicsPattern=f"{prefix}-.*",
        output=output,
        subscriptionPosition="Earliest",
    )
    assert created.status_code == 204, created.text
    wait_until(
        lambda: (
            authz.call("GET", "/admin/v3/functions/acme/prod/pattern/status", "acme-admin").json()[
                "numRunning"
            ]
            == 1
        ),
        30,
        "the pattern function running",
    )

    (message,) = collect(authz.client, output, 1, timeout=30)
    assert message.data() == b"one!"


def test_a_stateful_function_keeps_its_state_with_its_own_role(authz: Authz) -> None:
    created = authz.create("acme/prod/words", "acme-admin", EXAMPLES / "word_count.py")
    assert created.status_code == 204, created.text
    source = authz.running("acme/prod/words", "acme-admin")

    produce(authz.client, source, ["to be or not to be"])

    def count(role: str) -> httpx.Response:
        return authz.call("GET", "/admin/v3/functions/acme/prod/words/state/to", role)

    wait_until(lambda: count("acme-admin").json().get("numberValue") == 2, 30, "the count of 'to'")
    # another tenant's admin reads none of it
    assert count("beta-admin").status_code == 401
    assert count("beta-admin").json() == NOT_AUTHORIZED
    # put through the REST API (the worker writes the journal): the instance reads it back
    state = json.dumps({"key": "to", "numberValue": 10})
    put = authz.call(
        "POST",
        "/admin/v3/functions/acme/prod/words/state/to",
        "acme-admin",
        files={"state": (None, state)},
    )
    assert put.status_code == 204, put.text
    produce(authz.client, source, ["to"])
    wait_until(lambda: count("acme-admin").json().get("numberValue") == 11, 30, "10 + 1")


def test_the_broker_refuses_what_a_functions_own_client_does_beyond_its_tenant(
    authz: Authz, tmp_path: Path
) -> None:
    code = tmp_path / "hostile.py"
    code.write_text(HOSTILE)
    output = f"persistent://acme/prod/out-{uuid.uuid4().hex[:8]}"
    created = authz.create(
        "acme/prod/hostile", "acme-admin", code, output=output, className="hostile.Hostile"
    )
    assert created.status_code == 204, created.text
    source = authz.running("acme/prod/hostile", "acme-admin")
    beta_journal = journal_topic("beta/prod/victim", f"public/{authz.cluster.namespace}")
    probe = {
        "service_url": authz.pulsar.service_url,
        "own_topic": f"persistent://acme/prod/side-{uuid.uuid4().hex[:6]}",
        "send": {
            "own tenant": f"persistent://acme/prod/side-{uuid.uuid4().hex[:6]}",
            "other tenant": "persistent://beta/prod/in",
            "metadata": authz.system_topic("metadata"),
            "assignments": authz.system_topic("assignments"),
            "other journal": beta_journal,
        },
        "read": {
            "own journal": journal_topic("acme/prod/hostile", f"public/{authz.cluster.namespace}"),
            "metadata": authz.system_topic("metadata"),
            "packages": authz.system_topic("packages"),
            "other tenant": "persistent://beta/prod/in",
            "other journal": beta_journal,
        },
    }

    produce(authz.client, source, [json.dumps(probe)])

    (message,) = collect(authz.client, output, 1, timeout=60)
    report = json.loads(message.data())
    # a client without a token: the broker refuses its connection, which pulsar-client
    # tries again until its operation timeout
    assert report.pop("anonymous client") in (
        "refused: AuthenticationError",
        "refused: Timeout",
    )
    assert report == {
        "send own tenant": "allowed: sent",
        "send other tenant": "refused: AuthorizationError",
        "send metadata": "refused: AuthorizationError",
        "send assignments": "refused: AuthorizationError",
        "send other journal": "refused: AuthorizationError",
        "read own journal": "allowed: opened",
        "read metadata": "refused: AuthorizationError",
        "read packages": "refused: AuthorizationError",
        "read other tenant": "refused: AuthorizationError",
        "read other journal": "refused: AuthorizationError",
        "context.publish other tenant": "refused: PublishRefusedError",
    }


@pytest.mark.parametrize(
    ("field", "topic", "status"),
    [
        ("inputs", ["persistent://beta/prod/in"], 401),
        ("output", "persistent://beta/prod/out", 401),
        ("inputs", ["persistent://public/{namespace}/metadata"], 400),
        ("output", "persistent://public/{namespace}/assignments", 400),
    ],
)
def test_a_function_may_not_name_another_tenants_or_the_system_topics(
    authz: Authz, field: str, topic: str | list[str], status: int
) -> None:
    named = json.loads(json.dumps(topic).replace("{namespace}", authz.cluster.namespace))
    created = authz.create(
        f"acme/prod/nosy-{uuid.uuid4().hex[:6]}",
        "acme-admin",
        EXAMPLES / "exclamation.py",
        **{field: named},
    )
    assert created.status_code == status, created.text
    assert "reason" in created.json()


def test_another_tenants_function_its_state_logs_code_and_packages_are_out_of_reach(
    authz: Authz,
) -> None:
    created = authz.create("beta/prod/secret", "beta-admin", EXAMPLES / "exclamation.py")
    assert created.status_code == 204, created.text
    authz.running("beta/prod/secret", "beta-admin")
    package = "/admin/v3/packages/function/beta/prod/secret-code/v1"
    # (the packages API takes a superuser, where Pulsar's takes an admin of the tenant)
    uploaded = authz.call(
        "POST",
        package,
        "admin",
        files={"file": ("code.py", (EXAMPLES / "exclamation.py").read_bytes())},
        data={"metadata": json.dumps({"description": "beta's own"})},
    )
    assert uploaded.status_code == 204, uploaded.text
    function = "/admin/v3/functions/beta/prod/secret"
    attempts = [
        ("GET", package),
        ("GET", f"{package}/metadata"),
        ("DELETE", package),
        ("GET", "/admin/v3/packages/function/beta/prod"),
        ("GET", function),
        ("GET", f"{function}/status"),
        ("GET", f"{function}/state/key"),
        ("POST", f"{function}/state/key"),
        ("GET", f"{function}/0/logs"),
        ("GET", f"{function}/download"),
        ("POST", f"{function}/trigger"),
        ("DELETE", function),
    ]
    for method, path in attempts:
        answer = authz.call(method, path, "acme-admin")
        assert answer.status_code == 401, (method, path, answer.text)
    # the leader's internal path takes the workers' seal, never a tenant's token
    forged = authz.call(
        "POST",
        FORWARD_PATH,
        "acme-admin",
        json={"op": "delete", "fqfn": "beta/prod/secret"},
    )
    assert forged.json() == {
        "reason": f"{FORWARD_PATH} is for the cluster's workers only: a token cannot call it"
    }
    assert authz.call("GET", f"{function}/status", "beta-admin").json()["numRunning"] == 1
    assert authz.call("GET", package, "admin").status_code == 200
