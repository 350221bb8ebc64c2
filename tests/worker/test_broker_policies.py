"""Broker policies through the Apache Pulsar admin API: what is asked, and what a refusal,
a conflict or an unreachable broker does (never stop the worker).

The admin API is a fake served through ``httpx.MockTransport`` (the seam these tests own); it
answers like Pulsar's ``/admin/v2`` (404 for a missing tenant or topic, 409 for what exists).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from magnetar.broker import find_free_port
from magnetar.instance import FunctionConfig
from magnetar.instance.config import ProcessingGuarantees
from magnetar.instance.in_flight import InFlight
from magnetar.instance.metrics import MetricsSnapshot
from magnetar.worker.broker_admin import BrokerAdmin
from magnetar.worker.broker_policies import (
    COMPACTION_THRESHOLD_BYTES,
    BrokerPolicies,
    BrokerPreparedRuntime,
    broker_policies,
)
from magnetar.worker.config import WorkerConfig, load_worker_config
from magnetar.worker.exceptions import WorkerConfigError
from magnetar.worker.runtime import InstanceSpec, RuntimeHandle
from tests.worker.conftest import InProcessCluster

ADMIN_URL = "http://pulsar.test:8080"
SYSTEM = "persistent://public/magnetar"


@dataclass
class FakePulsarAdmin:
    """A Pulsar admin API in memory: tenants, namespaces, topics and their policies."""

    tenants: set[str] = field(default_factory=lambda: {"public"})
    namespaces: set[str] = field(default_factory=lambda: {"public/default"})
    topics: dict[str, int] = field(default_factory=dict)
    """Full topic name -> partitions (0: not partitioned)."""
    policies: dict[tuple[str, str], Any] = field(default_factory=dict)
    """(namespace or topic, policy) -> the JSON body it was set to."""
    refuse: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Path suffix -> (status, reason) answered instead."""
    calls: list[tuple[str, str, Any]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, path, body))
        for suffix, (status, reason) in self.refuse.items():
            if path.endswith(suffix):
                return _reason(status, reason)
        parts = path.removeprefix("/admin/v2/").split("/")
        if parts == ["clusters"]:
            return httpx.Response(200, json=["standalone"])
        if parts[0] == "tenants" and request.method == "PUT":
            if parts[1] in self.tenants:
                return _reason(409, "Tenant already exists")
            self.tenants.add(parts[1])
            self.policies[(parts[1], "tenant")] = body
            return httpx.Response(204)
        if parts[0] == "namespaces":
            return self._namespace(request.method, "/".join(parts[1:3]), parts[3:], body)
        if parts[0] == "persistent":
            topic = "persistent://" + "/".join(parts[1:4])
            return self._topic(request.method, topic, parts[4:], body)
        return _reason(404, "Not Found")

    def _namespace(self, method: str, name: str, rest: list[str], body: Any) -> httpx.Response:
        if method == "PUT" and not rest:
            if name.partition("/")[0] not in self.tenants:
                return _reason(404, "Tenant does not exist")
            if name in self.namespaces:
                return _reason(409, "Namespace already exists")
            self.namespaces.add(name)
            return httpx.Response(204)
        if name not in self.namespaces:
            return _reason(404, "Namespace does not exist")
        self.policies[(name, rest[0])] = body
        return httpx.Response(204)

    def _topic(self, method: str, topic: str, rest: list[str], body: Any) -> httpx.Response:
        namespace = topic.removeprefix("persistent://").rsplit("/", 1)[0]
        if not rest and method == "PUT":
            if namespace not in self.namespaces:
                return _reason(404, "Namespace does not exist")
            if topic in self.topics:
                return _reason(409, "This topic already exists")
            self.topics[topic] = 0
            return httpx.Response(204)
        if topic not in self.topics:
            return _reason(404, f"Topic {topic} not found")
        self.policies[(topic, rest[0])] = body
        return httpx.Response(204)

    def requests(self, method: str) -> list[str]:
        return [path for m, path, _ in self.calls if m == method]


def _reason(status: int, reason: str) -> httpx.Response:
    return httpx.Response(status, json={"reason": reason})


@pytest.fixture
def fake() -> FakePulsarAdmin:
    return FakePulsarAdmin()


@pytest.fixture
def policies(fake: FakePulsarAdmin) -> Iterator[BrokerPolicies]:
    made = BrokerPolicies(BrokerAdmin(ADMIN_URL, transport=httpx.MockTransport(fake.handle)))
    yield made
    made.close()


def unreachable_policies() -> BrokerPolicies:
    """Policies whose admin URL is a closed port on this machine: a real refused connection."""
    return BrokerPolicies(BrokerAdmin(f"http://127.0.0.1:{find_free_port()}", timeout_s=2))


def exactly_once(**fields: Any) -> FunctionConfig:
    fields.setdefault("inputs", ["in"])
    fields.setdefault("output", "out")
    return FunctionConfig(
        name="counter", processing_guarantees=ProcessingGuarantees.EFFECTIVELY_ONCE, **fields
    )


# --- the system namespace ------------------------------------------------------------------


def test_the_system_namespace_gets_retention_and_its_topics_compaction(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    assert policies.prepare_system_namespace(WorkerConfig()) is True

    assert "public/magnetar" in fake.namespaces
    forever = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    assert fake.policies[("public/magnetar", "retention")] == forever
    none = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    assert fake.policies[(f"{SYSTEM}/coordinate", "retention")] == none
    for name in ("metadata", "assignments", "packages"):
        assert fake.policies[(f"{SYSTEM}/{name}", "compactionThreshold")] == (
            COMPACTION_THRESHOLD_BYTES
        )
    assert f"{SYSTEM}/coordinate" not in {
        topic for topic, policy in fake.policies if policy == "compactionThreshold"
    }


def test_a_second_worker_finds_everything_there_and_succeeds(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    assert policies.prepare_system_namespace(WorkerConfig()) is True
    created = (set(fake.namespaces), dict(fake.topics))

    assert policies.prepare_system_namespace(WorkerConfig()) is True

    assert (set(fake.namespaces), dict(fake.topics)) == created
    # the second round's creations were all answered 409 and taken as done
    assert fake.requests("PUT").count("/admin/v2/namespaces/public/magnetar") == 2


def test_a_missing_tenant_is_created_on_every_cluster(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    config = WorkerConfig(system_namespace="magnetar/system")

    assert policies.prepare_system_namespace(config) is True

    assert "magnetar/system" in fake.namespaces
    assert fake.policies[("magnetar", "tenant")] == {
        "adminRoles": [],
        "allowedClusters": ["standalone"],
    }
    assert ("persistent://magnetar/system/metadata", "compactionThreshold") in fake.policies


def test_a_refused_step_is_logged_and_the_others_are_still_applied(
    policies: BrokerPolicies, fake: FakePulsarAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    fake.refuse["/namespaces/public/magnetar/retention"] = (403, "Don't have permission")

    with caplog.at_level(logging.ERROR):
        assert policies.prepare_system_namespace(WorkerConfig()) is False

    assert (
        "cannot set the retention of namespace public/magnetar: POST "
        f"{ADMIN_URL}/admin/v2/namespaces/public/magnetar/retention answered HTTP 403: "
        "Don't have permission; the worker goes on without it"
    ) in caplog.text
    assert (f"{SYSTEM}/packages", "compactionThreshold") in fake.policies


def test_an_unreachable_admin_api_is_logged_and_given_up_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policies = unreachable_policies()
    started = time.monotonic()
    with caplog.at_level(logging.ERROR):
        assert policies.prepare_system_namespace(WorkerConfig()) is False
    policies.close()

    assert time.monotonic() - started < 2  # one refused connection, not one per step
    errors = [record.getMessage() for record in caplog.records]
    assert len(errors) == 1
    assert "the Apache Pulsar admin API at http://127.0.0.1:" in errors[0]
    assert "cannot be reached (ConnectError" in errors[0]
    assert "goes on as if the broker had no admin API" in errors[0]


def test_an_url_that_is_not_a_pulsar_admin_api_is_named(
    fake: FakePulsarAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    fake.refuse["/clusters"] = (200, "a Magnetar worker perhaps")
    policies = BrokerPolicies(BrokerAdmin(ADMIN_URL, transport=httpx.MockTransport(fake.handle)))
    with caplog.at_level(logging.ERROR):
        assert policies.prepare_system_namespace(WorkerConfig()) is False
    policies.close()

    assert f"{ADMIN_URL} does not look like the Apache Pulsar admin API" in caplog.text
    assert fake.requests("PUT") == []


# --- deduplication -------------------------------------------------------------------------


def test_an_effectively_once_output_is_deduplicated_once(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    assert policies.ensure_deduplication(exactly_once()) is True

    output = "persistent://public/default/out"
    assert fake.topics[output] == 0
    assert fake.policies[(output, "deduplicationEnabled")] is True

    calls = len(fake.calls)
    assert policies.ensure_deduplication(exactly_once()) is True
    assert len(fake.calls) == calls  # remembered: no second round of requests


def test_an_existing_output_topic_is_deduplicated_too(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    fake.topics["persistent://public/default/out"] = 0

    assert policies.ensure_deduplication(exactly_once()) is True
    assert fake.policies[("persistent://public/default/out", "deduplicationEnabled")] is True


@pytest.mark.parametrize(
    "config",
    [
        FunctionConfig(name="f", inputs=["in"], output="out"),
        FunctionConfig(
            name="f",
            inputs=["in"],
            output="out",
            processing_guarantees=ProcessingGuarantees.ATMOST_ONCE,
        ),
        FunctionConfig(
            name="f", inputs=["in"], processing_guarantees=ProcessingGuarantees.EFFECTIVELY_ONCE
        ),
    ],
    ids=["at-least-once", "at-most-once", "no-output"],
)
def test_nothing_is_asked_for_other_guarantees_or_without_output(
    policies: BrokerPolicies, fake: FakePulsarAdmin, config: FunctionConfig
) -> None:
    assert policies.ensure_deduplication(config) is False
    assert fake.calls == []


@pytest.mark.parametrize(
    "config",
    [
        exactly_once(inputs=["partitioned"]),
        exactly_once(inputs=["a", "b"]),
        exactly_once(inputs=[], topics_pattern="persistent://public/default/in-.*"),
    ],
    ids=["partitioned-input", "two-inputs", "pattern"],
)
def test_outputs_of_several_input_partitions_are_deduplicated_too(
    policies: BrokerPolicies, fake: FakePulsarAdmin, config: FunctionConfig
) -> None:
    """Each input partition's outputs have a producer of their own, whose sequence ids grow."""
    assert policies.ensure_deduplication(config) is True
    assert fake.policies[("persistent://public/default/out", "deduplicationEnabled")] is True


def test_a_refused_deduplication_is_logged_and_tried_again_later(
    policies: BrokerPolicies, fake: FakePulsarAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    fake.refuse["/out/deduplicationEnabled"] = (500, "metadata store unavailable")

    with caplog.at_level(logging.ERROR):
        assert policies.ensure_deduplication(exactly_once()) is False
    assert (
        "cannot turn on deduplication for persistent://public/default/out: POST "
        f"{ADMIN_URL}/admin/v2/persistent/public/default/out/deduplicationEnabled answered "
        "HTTP 500: metadata store unavailable; public/default/counter runs without "
        "broker-side deduplication"
    ) in caplog.text

    del fake.refuse["/out/deduplicationEnabled"]
    assert policies.ensure_deduplication(exactly_once()) is True


@dataclass
class StartedHandle:
    """What the recording runtime hands back (only its identity matters here)."""

    spec: InstanceSpec
    pid: int | None = None

    def stop(self, drain: bool = True) -> None: ...

    def wait(self, timeout: float) -> bool:
        return True

    def kill(self) -> None: ...

    def is_alive(self) -> bool:
        return True

    def snapshot(self) -> MetricsSnapshot | None:
        return None

    def exit_error(self) -> str:
        return ""

    def in_flight(self) -> InFlight | None:
        return None

    def enforce_limits(self) -> None: ...


class RecordingRuntime:
    """The runtime seam: records which instances it was asked to start."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def prepare(self) -> None:
        """Nothing to prepare."""

    def close(self) -> None:
        """Nothing to release."""

    def start(self, spec: InstanceSpec) -> RuntimeHandle:
        self.started.append(spec.key)
        return StartedHandle(spec)


def test_the_runtime_deduplicates_before_starting_an_instance(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    inner = RecordingRuntime()
    spec = InstanceSpec("public/default/counter", 0, exactly_once(), 1)

    handle = BrokerPreparedRuntime(inner, policies, "public/magnetar").start(spec)

    assert isinstance(handle, StartedHandle) and handle.spec == spec
    assert inner.started == ["public/default/counter:0"]
    assert fake.policies[("persistent://public/default/out", "deduplicationEnabled")] is True


def test_the_instance_starts_even_when_the_admin_api_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = RecordingRuntime()
    policies = unreachable_policies()
    spec = InstanceSpec("public/default/counter", 0, exactly_once(), 1)

    with caplog.at_level(logging.ERROR):
        BrokerPreparedRuntime(inner, policies, "public/magnetar").start(spec)
    policies.close()

    assert inner.started == ["public/default/counter:0"]
    assert "cannot be reached" in caplog.text
    assert "runs without broker-side deduplication" in caplog.text


# --- a function's role and its state topics --------------------------------------------


def _grants(fake: FakePulsarAdmin) -> list[tuple[str, Any]]:
    return [(path, body) for method, path, body in fake.calls if "/permissions/" in path]


def test_the_functions_role_is_granted_its_own_state_topics_once(
    policies: BrokerPolicies, fake: FakePulsarAdmin
) -> None:
    fake.namespaces.add("public/magnetar")
    inner = RecordingRuntime()
    runtime = BrokerPreparedRuntime(inner, policies, "public/magnetar")
    spec = InstanceSpec("acme/prod/a-b", 0, FunctionConfig(name="a-b", inputs=["in"]), 1)

    runtime.start(replace(spec, role="acme-admin"))
    runtime.start(replace(spec, instance_id=1, role="acme-admin"))
    runtime.start(replace(spec, fqfn="acme/prod/other"))  # no credentials: nothing to grant

    # created first (Pulsar answers 404 for a grant on a missing topic), then granted
    assert f"{SYSTEM}/state-acme-prod-a=2Db" in fake.topics
    assert _grants(fake) == [
        (f"/admin/v2/persistent/public/magnetar/{name}/permissions/acme-admin", actions)
        for name in ("state-acme-prod-a=2Db", "snapshots-acme-prod-a=2Db")
        for actions in (["produce", "consume"],)
    ]
    assert inner.started == ["acme/prod/a-b:0", "acme/prod/a-b:1", "acme/prod/other:0"]


def test_a_refused_grant_is_logged_the_instance_starts_and_the_next_start_tries_again(
    policies: BrokerPolicies, fake: FakePulsarAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    fake.namespaces.add("public/magnetar")
    fake.refuse["/permissions/acme-admin"] = (403, "Don't have permission")
    inner = RecordingRuntime()
    runtime = BrokerPreparedRuntime(inner, policies, "public/magnetar")
    spec = InstanceSpec(
        "acme/prod/f", 0, FunctionConfig(name="f", inputs=["in"]), 1, role="acme-admin"
    )

    with caplog.at_level(logging.ERROR):
        runtime.start(spec)
    del fake.refuse["/permissions/acme-admin"]
    runtime.start(spec)

    assert "acme/prod/f cannot keep state with its role 'acme-admin'" in caplog.text
    assert "Don't have permission" in caplog.text
    assert inner.started == ["acme/prod/f:0", "acme/prod/f:0"]
    assert len(_grants(fake)) == 1 + 2


# --- the worker's own credentials ----------------------------------------------------------


def test_the_admin_api_is_called_with_the_workers_token() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(200, json=["standalone"])

    with_token = BrokerAdmin(ADMIN_URL, transport=httpx.MockTransport(answer), token="t0k")
    without = BrokerAdmin(ADMIN_URL, transport=httpx.MockTransport(answer))
    with_token.clusters()
    without.clusters()

    assert seen == ["Bearer t0k", None]


TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def test_the_workers_broker_token_is_read_as_pulsars_client_reads_it(tmp_path: Path) -> None:
    token_file = tmp_path / "worker.token"
    token_file.write_text("from-a-file\n")

    def token(params: str, plugin: str = TOKEN_PLUGIN) -> str | None:
        config = WorkerConfig(
            broker_client_authentication_plugin=plugin,
            broker_client_authentication_parameters=params,
        )
        assert config.broker_connection is not None
        return config.broker_connection.bearer_token()

    assert token("token:abc") == "abc"
    assert token(token_file.as_uri()) == "from-a-file"
    assert token(f"file:{token_file}") == "from-a-file"
    assert token("abc") == "abc"
    assert token("{}", plugin="org.apache.pulsar.client.impl.auth.AuthenticationTls") is None
    assert WorkerConfig().broker_connection is None


def test_a_missing_broker_token_file_is_a_config_error(tmp_path: Path) -> None:
    config = WorkerConfig(
        pulsar_admin_url=ADMIN_URL,
        broker_client_authentication_plugin=TOKEN_PLUGIN,
        broker_client_authentication_parameters=(tmp_path / "gone.token").as_uri(),
    )
    with pytest.raises(WorkerConfigError, match=r"cannot read the worker's broker token .*gone"):
        broker_policies(config)


def test_functions_on_threads_would_use_the_workers_credentials_and_the_worker_says_so(
    broker_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="magnetar.worker.service"):
        cluster = InProcessCluster(
            broker_url,
            tmp_path,
            size=1,
            broker_client_authentication_plugin=TOKEN_PLUGIN,
            broker_client_authentication_parameters="token:worker",  # pulsar-lite takes any
        )
    cluster.stop()

    assert "runtime 'thread' runs functions on a broker client with the worker's own" in (
        caplog.text
    )


# --- configuration -------------------------------------------------------------------------


def test_without_an_admin_url_nothing_is_asked_of_the_broker() -> None:
    assert broker_policies(WorkerConfig()) is None


def test_the_admin_url_comes_from_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MAGNETAR_PULSAR_ADMIN_URL", "http://pulsar:8080/")
    assert load_worker_config().pulsar_admin_url == "http://pulsar:8080"
    assert isinstance(broker_policies(load_worker_config()), BrokerPolicies)
    monkeypatch.setenv("MAGNETAR_PULSAR_ADMIN_URL", "")
    assert load_worker_config().pulsar_admin_url is None
    with pytest.raises(WorkerConfigError, match=r"pulsar_admin_url: .*http://broker:8080"):
        load_worker_config(pulsar_admin_url="pulsar://pulsar:6650")


# --- a worker whose broker admin cannot be reached -----------------------------------------


def test_a_worker_starts_and_serves_when_its_broker_admin_is_unreachable(
    broker_url: str, tmp_path: Path
) -> None:
    port = find_free_port()
    admin_url = f"http://127.0.0.1:{find_free_port()}"
    log = tmp_path / "worker.log"
    args = [
        *(sys.executable, "-m", "magnetar.cli", "--broker-url", broker_url),
        *("worker", "start", "--worker-id", "w-admin", "--http-port", str(port)),
        *("--data-dir", str(tmp_path / "data"), "--pulsar-admin-url", admin_url),
    ]
    env = {**os.environ, "MAGNETAR_SYSTEM_NAMESPACE": f"public/admin{port}"}
    with log.open("wb") as out:
        worker = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        ready = _wait_ready(f"http://127.0.0.1:{port}", worker, timeout=30)
        text = log.read_text()
        assert ready, f"the worker did not become ready:\n{text}"
        assert f"the Apache Pulsar admin API at {admin_url} cannot be reached" in text
        assert "goes on as if the broker had no admin API" in text
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert worker.returncode == 0, log.read_text()


def _wait_ready(url: str, worker: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.poll() is None:
        try:
            response = httpx.get(f"{url}/admin/v2/worker/cluster/leader/ready", timeout=2)
            if response.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
