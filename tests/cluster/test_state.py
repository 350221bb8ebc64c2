"""Function state on real workers: the REST state routes, the querystate/putstate CLI, and
word counts on a three-worker cluster that stay exact through kill -9 of an instance and
of a worker (EFFECTIVELY_ONCE)."""

from __future__ import annotations

import base64
import collections
import json
import subprocess
import threading
import time
import uuid
from typing import Any

import httpx
import pulsar
import pytest

from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.cluster.test_cluster import instance_processes, running
from tests.conftest import MAGNETAR

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a journal on the broker keeps the state of the function",
    "every worker reads the journal into rocksdb",
    "the counts are the same from every worker",
]


def state_url(worker: Worker, name: str, key: str) -> str:
    return f"{worker.url}/admin/v3/functions/public/default/{name}/state/{key}"


def put(worker: Worker, name: str, key: str, state: Any) -> httpx.Response:
    raw = state if isinstance(state, str) else json.dumps(state)
    return httpx.post(state_url(worker, name, key), files={"state": (None, raw)}, timeout=30)


def counts(worker: Worker, name: str, words: list[str]) -> dict[str, int]:
    found = {}
    for word in words:
        response = httpx.get(state_url(worker, name, word), timeout=30)
        if response.status_code == 200:
            found[word] = response.json()["numberValue"]
    return found


def wait_exact(worker: Worker, name: str, expected: dict[str, int], timeout: float) -> None:
    """Wait until ``worker`` answers the expected counts; the difference if it does not."""
    deadline = time.monotonic() + timeout
    while (got := counts(worker, name, list(expected))) != expected:
        if time.monotonic() > deadline:
            wrong = {w: (got.get(w), n) for w, n in expected.items() if got.get(w) != n}
            raise AssertionError(f"{worker.worker_id}: (counted, expected) {wrong}")
        time.sleep(0.5)


def expected_counts(lines: list[str]) -> dict[str, int]:
    return dict(collections.Counter(word for line in lines for word in line.split()))


def lines_in(client: pulsar.Client, topic: str, sent: list[str]) -> list[str]:
    """What ``topic`` holds, each message once (by id): every line ``sent``, and, on
    pulsar-lite, which has no deduplication, a line the producer sent again when the healer
    restarted the broker before it confirmed the first send."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    held: dict[tuple[int, int, int], str] = {}
    try:
        while True:
            try:
                message = reader.read_next(3000)
            except pulsar.Timeout:
                break
            mid = message.message_id()
            held[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = message.data().decode()
    finally:
        reader.close()
    lines = list(held.values())
    missing = collections.Counter(sent) - collections.Counter(lines)
    assert not missing, f"the input topic lost lines: {dict(missing)}"
    return lines


def create_word_count(
    cluster: Cluster, worker: Worker, name: str, topic: str, **config: Any
) -> None:
    response = cluster.create(
        worker,
        name,
        "word_count.py",
        className="word_count.WordCountFunction",
        inputs=[topic],
        subscriptionPosition="Earliest",
        **config,
    )
    assert response.status_code == 204, response.text


@pytest.mark.brokers("lite", "apache")
def test_state_routes_answer_with_pulsar_function_state(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    topic = f"words-{uuid.uuid4().hex[:6]}"
    create_word_count(cluster, worker, "wc", topic)
    producer = cluster_client.create_producer(topic)
    for line in TEXT:
        producer.send(line.encode())
    producer.close()
    expected = expected_counts(TEXT)
    wait_until(lambda: counts(worker, "wc", list(expected)) == expected, 30, "exact counts")
    assert httpx.get(state_url(worker, "wc", "the")).json() == {
        "key": "the",
        "stringValue": None,
        "byteValue": None,
        "numberValue": expected["the"],
        "version": expected["the"] - 1,
    }
    missing = httpx.get(state_url(worker, "wc", "absent"))
    assert (missing.status_code, missing.json()) == (404, {"reason": "key 'absent' doesn't exist."})
    unknown = httpx.get(state_url(worker, "nofn", "the"))
    assert unknown.status_code == 404
    assert unknown.json()["reason"] == "Function nofn doesn't exist"

    assert put(worker, "wc", "note", {"key": "note", "stringValue": "héllo"}).status_code == 204
    assert httpx.get(state_url(worker, "wc", "note")).json() == {
        "key": "note",
        "stringValue": "héllo",
        "byteValue": None,
        "numberValue": None,
        "version": 0,
    }
    binary = base64.b64encode(b"\x00\xff\xfe").decode()
    assert put(worker, "wc", "note", {"key": "note", "byteValue": binary}).status_code == 204
    got = httpx.get(state_url(worker, "wc", "note")).json()
    assert (got["byteValue"], got["stringValue"], got["version"]) == (binary, None, 1)
    assert put(worker, "wc", "the", {"numberValue": 1000}).status_code == 204
    assert httpx.get(state_url(worker, "wc", "the")).json()["numberValue"] == 1000

    bad = {
        "{not json": "state is not valid FunctionState JSON",
        json.dumps(
            {"key": "k", "numberValue": 1.5}
        ): "numberValue must be an integer counter, got 1.5",
        json.dumps({"key": "k", "numberValue": 2**63}): "does not fit a signed 64-bit integer",
        json.dumps({"key": "k", "stringValue": "x" * (1024 * 1024 + 1)}): (
            "the value is 1,048,577 bytes, more than the limit of 1,048,576 bytes (1 MiB)"
        ),
        json.dumps({"key": "other", "stringValue": "v"}): "Path key doesn't match key in json",
        json.dumps({"key": "k", "stringValue": "v", "numberValue": 1}): "exactly one of",
        json.dumps({"key": "k", "byteValue": "***"}): "byteValue is not valid base64",
        json.dumps(["k"]): "state must be a JSON object",
    }
    for body, reason in bad.items():
        answer = put(worker, "wc", "k", body)
        assert answer.status_code == 400, (body[:40], answer.text)
        assert reason in answer.json()["reason"], answer.json()
    no_field = httpx.post(state_url(worker, "wc", "k"), files={"other": (None, "{}")})
    assert no_field.status_code == 400
    assert "multipart field 'state'" in no_field.json()["reason"]
    assert httpx.get(state_url(worker, "wc", "k")).status_code == 404


def cli(worker: Worker, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MAGNETAR, "--admin-url", worker.url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def test_querystate_and_putstate_from_the_cli(cluster: Cluster) -> None:
    worker = cluster.start_worker("w1")
    create_word_count(cluster, worker, "cli-wc", f"words-{uuid.uuid4().hex[:6]}")
    put_out = cli(
        worker,
        "functions",
        "putstate",
        "--name",
        "cli-wc",
        "--state",
        '{"key": "n", "numberValue": 41}',
    )
    assert put_out.stdout.strip() == "Put state key 'n' of public/default/cli-wc successfully"
    table = cli(worker, "functions", "querystate", "--name", "cli-wc", "--key", "n").stdout
    assert table.split("\n")[0].split() == ["key", "type", "value", "version"]
    assert table.split("\n")[1].split() == ["n", "counter", "41", "0"]
    as_json = cli(
        worker,
        "--output",
        "json",
        "functions",
        "querystate",
        "--fqfn",
        "public/default/cli-wc",
        "-k",
        "n",
    ).stdout
    assert json.loads(as_json) == {
        "key": "n",
        "stringValue": None,
        "byteValue": None,
        "numberValue": 41,
        "version": 0,
    }
    missing = cli(
        worker, "functions", "querystate", "--name", "cli-wc", "--key", "nope", check=False
    )
    assert missing.returncode == 1
    assert "Reason: key 'nope' doesn't exist." in missing.stderr
    bad = cli(worker, "functions", "putstate", "--name", "cli-wc", "--state", "{oops", check=False)
    assert bad.returncode == 2
    assert "Invalid value for '--state': not valid JSON" in bad.stderr
    refused = cli(
        worker,
        "functions",
        "putstate",
        "--name",
        "cli-wc",
        "--state",
        '{"key": "n", "numberValue": "many"}',
        check=False,
    )
    assert refused.returncode == 1
    assert "Reason: numberValue must be an integer counter, got 'many'" in refused.stderr

    watch = subprocess.Popen(
        [
            *MAGNETAR,
            "--admin-url",
            worker.url,
            "functions",
            "querystate",
            "--name",
            "cli-wc",
            "--key",
            "w",
            "--watch",
            "--interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watch.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("doesn't exist" in line for line in lines), 30, "watch: no key")
        cli(
            worker,
            "functions",
            "putstate",
            "--name",
            "cli-wc",
            "--state",
            '{"key": "w", "stringValue": "one"}',
        )
        wait_until(
            lambda: any(line.split()[:3] == ["w", "string", "one"] for line in lines), 30, "one"
        )
        cli(
            worker,
            "functions",
            "putstate",
            "--name",
            "cli-wc",
            "--state",
            '{"key": "w", "stringValue": "two"}',
        )
        wait_until(
            lambda: any(line.split()[:3] == ["w", "string", "two"] for line in lines), 30, "two"
        )
    finally:
        watch.terminate()
        watch.wait(10)


@pytest.mark.brokers("lite", "apache")
def test_deleting_a_function_deletes_its_state_unless_kept(cluster: Cluster) -> None:
    worker = cluster.start_worker("w1")
    topic = f"words-{uuid.uuid4().hex[:6]}"
    create_word_count(cluster, worker, "fleeting", topic)
    assert put(worker, "fleeting", "k", {"stringValue": "v"}).status_code == 204
    kept = httpx.delete(
        f"{worker.url}/admin/v3/functions/public/default/fleeting", params={"keepState": "true"}
    )
    assert kept.status_code == 204, kept.text
    create_word_count(cluster, worker, "fleeting", topic)
    got = httpx.get(state_url(worker, "fleeting", "k"))
    assert got.json().get("stringValue") == "v", (got.status_code, got.text)
    deleted = httpx.delete(f"{worker.url}/admin/v3/functions/public/default/fleeting", timeout=30)
    assert deleted.status_code == 204, deleted.text
    create_word_count(cluster, worker, "fleeting", topic)
    assert httpx.get(state_url(worker, "fleeting", "k")).status_code == 404


def test_word_count_with_parallelism_3_is_exact_from_every_worker(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    workers = cluster.start(3)
    topic = f"words-{uuid.uuid4().hex[:6]}"
    create_word_count(cluster, workers[1], "shared-wc", topic, parallelism=3)
    wait_until(lambda: running(cluster, workers[0], "shared-wc") == 3, 20, "three instances")
    lines = [f"{TEXT[i % 4]} n{i % 11}" for i in range(2000)]
    # a burst: the producer waits for room in its queue (or send_async would fail the rest)
    producer = cluster_client.create_producer(
        topic, batching_enabled=False, block_if_queue_full=True
    )
    for line in lines:
        producer.send_async(line.encode(), None)
    producer.flush()
    producer.close()
    expected = expected_counts(lines)
    wait_exact(workers[0], "shared-wc", expected, 60)
    for worker in workers:
        assert counts(worker, "shared-wc", list(expected)) == expected, worker.worker_id
    received = [
        i["status"]["numReceived"] for i in cluster.status(workers[2], "shared-wc")["instances"]
    ]
    assert sum(1 for n in received if n > 0) >= 2, received  # instances counted side by side


@pytest.mark.brokers("lite", "apache")
def test_effectively_once_word_count_is_exact_after_kill_9_of_an_instance_and_a_worker(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    """Parallelism 3 on a Failover subscription (one active consumer, two standing by):
    kill -9 the active instance's process mid-stream, which the runtime restarts, then its
    worker, whose instances move to the others."""
    workers = cluster.start(3)
    topic = f"words-{uuid.uuid4().hex[:6]}"
    create_word_count(
        cluster,
        workers[0],
        "eo-wc",
        topic,
        processingGuarantees="EFFECTIVELY_ONCE",
        parallelism=3,
    )
    wait_until(lambda: running(cluster, workers[0], "eo-wc") == 3, 20, "three instances")
    lines: list[str] = []
    kills_survived = threading.Event()

    def stream() -> None:
        """Lines until the kills are over and a second more, so they all land mid-stream."""
        producer = cluster_client.create_producer(topic, batching_enabled=False)
        end = None
        while end is None or len(lines) < end:
            line = f"{TEXT[len(lines) % 4]} n{len(lines) % 13}"
            producer.send_async(line.encode(), None)
            lines.append(line)
            time.sleep(0.002)
            if end is None and kills_survived.is_set():
                end = len(lines) + 500
        producer.flush()
        producer.close()

    producer = threading.Thread(target=stream)
    producer.start()
    try:
        # kill -9 the consuming instance mid-stream; the runtime manager restarts it
        host = active_worker(cluster, workers[0], "eo-wc")
        subprocess.run(["kill", "-9", *instance_processes(host)], check=True)
        witness = next(w for w in workers if w is not host)

        def restarted() -> bool:
            status = cluster.status(witness, "eo-wc")
            restarts = sum(i["status"]["numRestarts"] for i in status["instances"])
            return restarts >= 1 and status["numRunning"] == 3

        wait_until(restarted, 30, "the killed instance restarted")
        # then kill -9 its worker: its machine dies, instances and all, and they move elsewhere
        victim = host
        instances = instance_processes(victim)
        victim.kill()
        subprocess.run(["kill", "-9", *instances], check=False)

        def moved() -> bool:
            try:
                status = cluster.status(witness, "eo-wc")
            except httpx.HTTPError:
                return False
            hosts = {i["status"]["workerId"] for i in status["instances"]}
            return victim.worker_id not in hosts and status["numRunning"] == 3

        wait_until(moved, 60, "the dead worker's instances running elsewhere")
    finally:
        kills_survived.set()
        producer.join(120)
    survivors = [w for w in workers if w is not victim]
    # exactly once per message the input holds (the broker restarts may have stored one twice)
    expected = expected_counts(lines_in(cluster_client, topic, lines))
    wait_exact(survivors[0], "eo-wc", expected, 120)
    for worker in survivors:
        assert counts(worker, "eo-wc", list(expected)) == expected, worker.worker_id
    revived = cluster.restart(victim)
    assert counts(revived, "eo-wc", list(expected)) == expected


def active_worker(cluster: Cluster, via: Worker, name: str, timeout: float = 30) -> Worker:
    """The worker running the instance that receives messages now (the Failover consumer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = {
            i["instanceId"]: i["status"]["numReceived"]
            for i in cluster.status(via, name)["instances"]
        }
        time.sleep(0.5)
        for instance in cluster.status(via, name)["instances"]:
            status = instance["status"]
            if status["running"] and status["numReceived"] > before.get(instance["instanceId"], 0):
                return cluster.workers[status["workerId"]]
    raise AssertionError(f"no instance of {name} is consuming")
