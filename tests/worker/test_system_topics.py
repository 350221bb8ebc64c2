"""The workers' own records and paths cannot be forged: a plain client of the broker (what a
function is) publishes records that look like a worker's to the system topics, and calls
the internal paths; nothing changes. A worker refuses system topics another kind of
functions worker writes."""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from magnetar.broker import find_free_port
from magnetar.worker.cluster_key import ClusterKey, PeerSeal
from magnetar.worker.config import WorkerConfig
from magnetar.worker.exceptions import ForeignSystemTopicError
from magnetar.worker.functions import FORWARD_PATH
from magnetar.worker.service import WorkerService
from tests.worker.conftest import InProcessCluster, receive_until
from tests.worker.test_rest_codes import CLASS, FUNCTIONS, form

pytestmark = pytest.mark.brokers("lite", "apache")

KEY = secrets.token_bytes(32)


@dataclass
class Sealed:
    cluster: InProcessCluster
    client: pulsar.Client
    name: str
    """A function of one instance, registered and running: input -> output + '!'."""
    input: str
    output: str

    def system_topic(self, name: str) -> str:
        return self.cluster.workers[0].config.system_topic(name)

    def call(self, method: str, path: str, via: str = "follower", **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.cluster.url(via) + path, timeout=30, **kwargs)

    def forge(self, topic: str, value: bytes, properties: dict[str, str]) -> None:
        """Publish as any client of the broker can."""
        producer = self.client.create_producer(self.system_topic(topic))
        producer.send(value, properties=properties)
        producer.close()

    def register(self, name: str) -> None:
        body = {"className": CLASS, "inputs": [self.input], "output": f"{self.output}-{name}"}
        answer = self.call("POST", f"{FUNCTIONS}/{name}", **form(body))
        assert answer.status_code == 204, answer.text

    def assert_runs(self) -> None:
        """Still registered on every worker, and still answering its input."""
        for worker in self.cluster.workers:
            url = f"{worker.config.admin_url}{FUNCTIONS}/{self.name}"
            assert httpx.get(url, timeout=10).status_code == 200
        word = f"w{uuid.uuid4().hex[:8]}"  # never all digits, which the SerDe makes an int
        producer = self.client.create_producer(self.input)
        producer.send(word.encode())
        producer.close()
        got = receive_until(self.client, self.output, {f"{word}!"}, subscription=word)
        assert f"{word}!" in got

    def assignments(self) -> dict[str, str]:
        """Instance key -> the worker it is assigned to, as the leader says."""
        by_worker = self.call("GET", "/admin/v2/worker/assignments", "leader").json()
        return {key: worker for worker, keys in by_worker.items() for key in keys}


@pytest.fixture(scope="module")
def sealed(
    broker_url: str,
    admin_url: str | None,
    client: pulsar.Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Sealed]:
    cluster = InProcessCluster(
        broker_url,
        tmp_path_factory.mktemp("sealed"),
        cluster_key="data:;base64," + base64.b64encode(KEY).decode(),
        pulsar_admin_url=admin_url,
        request_timeout_s=10,
    )
    suffix = uuid.uuid4().hex[:6]
    made = Sealed(cluster, client, "victim", f"sealed-in-{suffix}", f"sealed-out-{suffix}")
    try:
        body = {"className": CLASS, "inputs": [made.input], "output": made.output}
        answer = made.call("POST", f"{FUNCTIONS}/{made.name}", **form(body))
        assert answer.status_code == 204, answer.text
        deadline = time.monotonic() + 60
        status = f"{FUNCTIONS}/{made.name}/status"
        while made.call("GET", status).json()["numRunning"] != 1:
            assert time.monotonic() < deadline, "the function did not start"
            time.sleep(0.2)
        made.assert_runs()
        yield made
    finally:
        cluster.stop()


def test_a_forged_metadata_record_deletes_and_changes_nothing(
    sealed: Sealed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="magnetar.worker.cluster_key")
    fqfn = f"public/default/{sealed.name}"
    forged = {"type": "function", "fqfn": fqfn, "term": "1", "leader": "w0", "version": "9999"}
    sealed.forge("metadata", b"", forged)  # a delete, as seen in the wild
    sealed.forge("metadata", b"", {**forged, "magnetar-seal": "v1:" + "A" * 43})  # a guess
    changed = {"fqfn": fqfn, "config": {"parallelism": 0}, "package": None, "version": 10000}
    sealed.forge("metadata", json.dumps(changed).encode(), {**forged, "version": "10000"})
    sealed.forge("metadata", b"", {"type": "__term__", "term": "99999", "leader": "intruder"})
    # A change made after the forgeries returns once every worker has applied it: the
    # forgeries were read (and dropped) before it.
    sealed.register(f"after-{uuid.uuid4().hex[:6]}")
    sealed.assert_runs()
    status = sealed.call("GET", f"{FUNCTIONS}/{sealed.name}/status").json()
    assert status["numInstances"] == 1
    warnings = [r.getMessage() for r in caplog.records if "dropped a record" in r.getMessage()]
    topic = sealed.system_topic("metadata")
    # one per worker: the rest within the next 10 s are counted, not logged
    assert len(warnings) == 2, warnings
    assert all(w.startswith(f"dropped a record on {topic} (message ") for w in warnings)
    assert all("whose seal is missing" in w for w in warnings)


def test_a_replayed_genuine_record_changes_nothing(sealed: Sealed) -> None:
    name = f"phoenix-{uuid.uuid4().hex[:6]}"
    sealed.register(name)
    assert sealed.call("DELETE", f"{FUNCTIONS}/{name}").status_code == 204
    sealed.register(name)
    # every record the leader wrote for it, seal and all: the registration, the delete, ...
    reader = sealed.client.create_reader(sealed.system_topic("metadata"), pulsar.MessageId.earliest)
    records = []
    try:
        while True:
            try:
                message = reader.read_next(2000)
            except pulsar.Timeout:
                break
            if message.properties().get("fqfn") == f"public/default/{name}":
                records.append((message.data(), message.properties()))
    finally:
        reader.close()
    assert len(records) == 3
    for data, properties in records:
        sealed.forge("metadata", data, properties)
    sealed.register(f"after-{uuid.uuid4().hex[:6]}")
    assert sealed.call("GET", f"{FUNCTIONS}/{name}").status_code == 200
    for worker in sealed.cluster.workers:
        url = f"{worker.config.admin_url}{FUNCTIONS}/{name}"
        assert httpx.get(url, timeout=10).status_code == 200


def test_a_forged_assignment_starts_and_stops_nothing(sealed: Sealed) -> None:
    before = sealed.assignments()
    assert f"public/default/{sealed.name}:0" in before
    intruder = {"workerId": "intruder", "adminUrl": "http://127.0.0.1:9"}
    record = {
        "term": 99999,
        "version": 1,
        "leader": intruder,
        "workers": [intruder],
        "assignment": {"public/default/ghost:0": "w0", "public/default/ghost:1": "w1"},
        "draining": [],
    }
    sealed.forge("assignments", json.dumps(record).encode(), {"term": "99999"})
    # A new function makes the leader publish an assignment, after the forgery.
    name = f"later-{uuid.uuid4().hex[:6]}"
    sealed.register(name)
    deadline = time.monotonic() + 10
    while f"public/default/{name}:0" not in (after := sealed.assignments()):
        assert time.monotonic() < deadline, f"{name} was never assigned: {after}"
        time.sleep(0.1)
    assert not [key for key in after if "ghost" in key]
    assert set(after.values()) <= {"w0", "w1"}
    assert {key: after[key] for key in before} == before
    leader = sealed.call("GET", "/admin/v2/worker/cluster/leader").json()["workerId"]
    assert leader in {"w0", "w1"}
    sealed.assert_runs()


def test_a_forged_heartbeat_makes_no_member_and_no_leader(sealed: Sealed) -> None:
    leader = sealed.call("GET", "/admin/v2/worker/cluster/leader").json()["workerId"]
    deadline = time.monotonic() + 4  # a genuine heartbeat shows up within a second
    while time.monotonic() < deadline:
        beat = {
            "workerId": "intruder",
            "adminUrl": "http://127.0.0.1:9",
            "sentAt": time.time(),
            "assignment": None,
            "starting": [],
        }
        sealed.forge("coordinate", json.dumps(beat).encode(), {})
        members = {w["workerId"] for w in sealed.call("GET", "/admin/v2/worker/cluster").json()}
        assert members == {"w0", "w1"}
        time.sleep(0.3)
    assert sealed.call("GET", "/admin/v2/worker/cluster/leader").json()["workerId"] == leader
    sealed.assert_runs()


def test_internal_paths_take_the_workers_own_calls_only(sealed: Sealed) -> None:
    name = f"doomed-{uuid.uuid4().hex[:6]}"
    sealed.register(name)
    change = json.dumps({"op": "delete", "fqfn": f"public/default/{name}"}).encode()
    headers = {"Content-Type": "application/json"}
    url = sealed.cluster.url("leader") + FORWARD_PATH
    refused = httpx.post(url, content=change, headers=headers, timeout=10)
    assert refused.status_code == 401
    assert refused.json() == {
        "reason": f"{FORWARD_PATH} is for the cluster's workers only: a token cannot call it"
    }
    stranger = PeerSeal(ClusterKey(secrets.token_bytes(32)), "w0")
    wrong = httpx.post(
        url, content=change, headers=headers | stranger.headers("POST", FORWARD_PATH, change)
    )
    assert wrong.status_code == 401
    assert wrong.json() == {
        "reason": "the X-Magnetar-Worker header is not a worker's of this cluster"
    }
    assert sealed.call("GET", f"{FUNCTIONS}/{name}").status_code == 200

    worker = PeerSeal(ClusterKey(KEY), "w1")
    other_body = worker.headers("POST", FORWARD_PATH, b"{}")
    tampered = httpx.post(url, content=change, headers=headers | other_body)
    assert tampered.status_code == 401
    accepted = httpx.post(
        url, content=change, headers=headers | worker.headers("POST", FORWARD_PATH, change)
    )
    assert accepted.status_code == 200, accepted.text
    gone = sealed.call("GET", f"{FUNCTIONS}/{name}", via="leader")
    assert gone.status_code == 404


APACHE_SERVICE_REQUEST = bytes.fromhex("0801121c0a1a0a067075626c69631207") + b"default"
"""The start of a protobuf record as Apache Pulsar's functions worker writes it."""


@pytest.mark.parametrize("topic", ["metadata", "assignments"])
def test_a_worker_refuses_system_topics_another_functions_worker_writes(
    broker_url: str, admin_url: str | None, client: pulsar.Client, tmp_path: Path, topic: str
) -> None:
    config = WorkerConfig(
        worker_id="w0",
        broker_url=broker_url,
        http_port=find_free_port(),
        data_dir=tmp_path,
        runtime="thread",
        system_namespace=f"public/foreign{uuid.uuid4().hex[:6]}",
        pulsar_admin_url=admin_url,
    )
    if admin_url is not None:  # the other worker made the namespace
        made = httpx.put(f"{admin_url}/admin/v2/namespaces/{config.system_namespace}", timeout=30)
        assert made.status_code == 204, made.text
    producer = client.create_producer(config.system_topic(topic))
    producer.send(APACHE_SERVICE_REQUEST, partition_key="public/default/fn")
    producer.close()
    with pytest.raises(ForeignSystemTopicError) as refused:
        WorkerService(config).start()
    message = str(refused.value)
    assert message.startswith(
        f"{config.system_topic(topic)} holds records that are not a Magnetar worker's"
    )
    assert "Give Magnetar a namespace of its own with system_namespace" in message


def test_an_upgraded_cluster_keeps_its_unsealed_history_when_told_to(
    broker_url: str, admin_url: str | None, client: pulsar.Client, tmp_path: Path
) -> None:
    namespace = f"public/upgrade{uuid.uuid4().hex[:6]}"
    key = "data:;base64," + base64.b64encode(secrets.token_bytes(32)).decode()
    common: dict[str, Any] = {"system_namespace": namespace, "pulsar_admin_url": admin_url}
    before = InProcessCluster(broker_url, tmp_path / "before", size=1, **common)
    try:
        body = {"className": CLASS, "inputs": [f"upgrade-in-{uuid.uuid4().hex[:6]}"]}
        made = httpx.post(f"{before.url('leader')}{FUNCTIONS}/old", timeout=30, **form(body))
        assert made.status_code == 204, made.text
    finally:
        before.stop()

    keyed = InProcessCluster(broker_url, tmp_path / "keyed", size=1, cluster_key=key, **common)
    try:  # the unsealed records are dropped like forged ones
        assert httpx.get(f"{keyed.url('leader')}{FUNCTIONS}/old", timeout=10).status_code == 404
    finally:
        keyed.stop()

    upgraded = InProcessCluster(
        broker_url,
        tmp_path / "upgraded",
        size=1,
        cluster_key=key,
        accept_unsealed_history=True,
        **common,
    )
    try:
        url = upgraded.url("leader")
        assert httpx.get(f"{url}{FUNCTIONS}/old", timeout=10).status_code == 200
        topic = upgraded.workers[0].config.system_topic("metadata")
        producer = client.create_producer(topic)
        forged = {"fqfn": "public/default/old", "term": "1", "leader": "w0", "version": "999"}
        producer.send(b"", properties=forged)
        producer.close()
        body = {"className": CLASS, "inputs": [f"upgrade-in-{uuid.uuid4().hex[:6]}"]}
        made = httpx.post(f"{url}{FUNCTIONS}/new", timeout=30, **form(body))
        assert made.status_code == 204, made.text
        assert httpx.get(f"{url}{FUNCTIONS}/old", timeout=10).status_code == 200
    finally:
        upgraded.stop()
