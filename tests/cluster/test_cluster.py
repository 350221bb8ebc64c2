"""Three worker processes on one broker: scheduling, failover, fencing, restarts."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from signal import SIGCONT

import httpx
import pulsar
import pytest

from magnetar.testing import descendants_named
from magnetar.testing.stream import Stream
from magnetar.worker.runtime import INSTANCE_PROCESS_NAME
from tests.cluster.conftest import Cluster, Worker, wait_until

LIVENESS_S = 3.0


def instance_processes(worker: Worker) -> list[str]:
    """Pids of the worker's running instance processes (forked by its fork server, so not
    its children); warm ones waiting for an instance are not counted."""
    return [str(pid) for pid in descendants_named(worker.process.pid, INSTANCE_PROCESS_NAME)]


def running(cluster: Cluster, via: Worker, name: str) -> int:
    try:
        return int(cluster.status(via, name)["numRunning"])
    except httpx.HTTPError:
        return -1


def non_leader(cluster: Cluster, workers: list[Worker]) -> Worker:
    leader = cluster.leader_id(workers[0])
    return next(w for w in workers if w.worker_id != leader and w.process.poll() is None)


def stream_into(client: pulsar.Client, topic: str) -> Stream:
    """A steady stream into ``topic``, the exclamation outputs of ``<topic>-out`` collected."""
    return Stream(client, topic, f"{topic}-out").start()


def stop_and_check(stream: Stream, timeout: float = 30.0) -> None:
    """Stop the stream; every input it sent gets its output within ``timeout``."""
    stream.stop()
    complete = stream.wait_complete(timeout)
    missing = stream.missing()
    stream.close()
    assert complete, f"{len(missing)} of {len(stream.sent)} inputs have no output: {missing[:20]}"


def test_create_on_any_worker_runs_one_instance_on_each_worker(cluster: Cluster) -> None:
    # how quickly is bench/cluster_latency.py's to measure: CI asserts no timings
    workers = cluster.start(3)
    target = non_leader(cluster, workers)
    response = cluster.create(target, "quick", inputs=[f"in-{uuid.uuid4().hex[:6]}"], parallelism=3)
    assert response.status_code == 204, response.text
    wait_until(lambda: running(cluster, target, "quick") == 3, 30, "three instances running")
    owners = cluster.assignments(workers[0])
    assert sorted(len(keys) for keys in owners.values()) == [1, 1, 1]
    # Every worker serves the same metadata (read-your-writes on the one asked).
    for worker in workers:
        assert cluster.get(worker, "/admin/v3/functions/public/default") == ["quick"]


def test_update_and_restart_run_every_instance_anew_on_three_workers(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    workers = cluster.start(3)
    topic = f"in-{uuid.uuid4().hex[:6]}"
    created = cluster.create(
        workers[0],
        "greeter",
        example="user_config.py",
        className="user_config.GreetingFunction",
        inputs=[topic],
        output=f"{topic}-out",
        parallelism=4,
        userConfig={"greeting": "Hello"},
    )
    assert created.status_code == 204, created.text
    wait_until(lambda: running(cluster, workers[1], "greeter") == 4, 30, "all 4 running")
    hosts = {i["status"]["workerId"] for i in cluster.status(workers[2], "greeter")["instances"]}
    assert hosts == {"w1", "w2", "w3"}
    consumer = cluster_client.subscribe(
        f"{topic}-out", "check", initial_position=pulsar.InitialPosition.Earliest
    )
    producer = cluster_client.create_producer(topic, batching_enabled=False)

    def outputs(count: int) -> list[str]:
        """The outputs of ``count`` new inputs (redelivered duplicates dropped)."""
        sent = {f"v{uuid.uuid4().hex[:8]}" for _ in range(count)}
        for value in sent:
            producer.send(value.encode())
        found: dict[str, str] = {}
        while set(found) != sent:
            greeting, value = consumer.receive(15_000).data().decode().split(", ")
            if value in sent:
                found[value] = greeting
        return sorted(found.values())

    def processes() -> set[str]:
        return {pid for worker in workers for pid in instance_processes(worker)}

    assert outputs(8) == ["Hello"] * 8
    first = processes()
    assert len(first) == 4

    config = {"userConfig": {"greeting": "Hi"}}
    updated = httpx.put(
        f"{workers[1].url}/admin/v3/functions/public/default/greeter",
        data={"functionConfig": json.dumps(config)},
        timeout=30,
    )
    assert updated.status_code == 204, updated.text
    wait_until(lambda: len(processes() - first) == 4, 30, "4 new instance processes")
    wait_until(lambda: running(cluster, workers[0], "greeter") == 4, 30, "all 4 running")
    assert outputs(8) == ["Hi"] * 8
    second = processes()

    restarted = httpx.post(
        f"{workers[2].url}/admin/v3/functions/public/default/greeter/restart", timeout=30
    )
    assert restarted.status_code == 204, restarted.text
    wait_until(lambda: len(processes() - second) == 4, 30, "4 new instance processes")
    wait_until(lambda: running(cluster, workers[0], "greeter") == 4, 30, "all 4 running")
    restarts = [
        i["status"]["numRestarts"] for i in cluster.status(workers[0], "greeter")["instances"]
    ]
    assert restarts == [1, 1, 1, 1]
    assert outputs(8) == ["Hi"] * 8
    assert not processes() & (first | second)


@pytest.mark.brokers("lite", "apache")
def test_concurrent_creates_of_one_function_one_wins(cluster: Cluster) -> None:
    workers = cluster.start(3)
    topic = f"in-{uuid.uuid4().hex[:6]}"
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda w: cluster.create(w, "twin", inputs=[topic]), workers[:2]))
    codes = sorted(a.status_code for a in answers)
    assert codes == [204, 400], [a.text for a in answers]
    conflict = next(a for a in answers if a.status_code == 400)
    assert conflict.json()["reason"] == "Function twin already exists"


@pytest.mark.brokers("lite", "apache")
def test_kill_a_non_leader_under_a_stream_loses_nothing(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    workers = cluster.start(3)
    topic = f"in-{uuid.uuid4().hex[:6]}"
    assert (
        cluster.create(
            workers[0],
            "survivor",
            inputs=[topic],
            output=f"{topic}-out",
            parallelism=3,
            subscriptionPosition="Earliest",
        ).status_code
        == 204
    )
    wait_until(lambda: running(cluster, workers[0], "survivor") == 3, 10, "running")
    stream = stream_into(cluster_client, topic)
    time.sleep(1.5)
    victim = non_leader(cluster, workers)
    victim.kill()
    killed_at = time.monotonic()
    witness = next(w for w in workers if w is not victim)
    took = wait_until(
        lambda: (
            victim.worker_id not in cluster.assignments(witness)
            and running(cluster, witness, "survivor") == 3
        ),
        LIVENESS_S + 2 + 3,
        "instances running elsewhere",
    )
    assert time.monotonic() - killed_at <= LIVENESS_S + 2 + 3, took
    time.sleep(1)
    stop_and_check(stream)


@pytest.mark.brokers("lite", "apache")
def test_kill_the_leader_elects_a_new_one_and_loses_nothing(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    workers = cluster.start(3)
    topic = f"in-{uuid.uuid4().hex[:6]}"
    assert (
        cluster.create(
            workers[1],
            "phoenix",
            inputs=[topic],
            output=f"{topic}-out",
            parallelism=3,
            subscriptionPosition="Earliest",
        ).status_code
        == 204
    )
    wait_until(lambda: running(cluster, workers[1], "phoenix") == 3, 10, "running")
    stream = stream_into(cluster_client, topic)
    time.sleep(1.5)
    old_leader = cluster.leader_id(workers[0])
    leader = next(w for w in workers if w.worker_id == old_leader)
    leader.kill()
    witness = next(w for w in workers if w is not leader)
    elected = wait_until(
        lambda: cluster.leader_id(witness) != old_leader, LIVENESS_S + 2, "a new leader"
    )
    wait_until(
        lambda: running(cluster, witness, "phoenix") == 3, LIVENESS_S + 5, "instances running again"
    )
    assert elected <= LIVENESS_S + 2
    stop_and_check(stream)


def test_a_restarted_worker_gets_a_fair_share_after_rebalance(cluster: Cluster) -> None:
    workers = cluster.start(3)
    assert (
        cluster.create(
            workers[0], "spread", inputs=[f"in-{uuid.uuid4().hex[:6]}"], parallelism=6
        ).status_code
        == 204
    )
    wait_until(lambda: running(cluster, workers[0], "spread") == 6, 10, "running")
    victim = non_leader(cluster, workers)
    victim.kill()
    witness = next(w for w in workers if w is not victim)
    wait_until(
        lambda: victim.worker_id not in cluster.assignments(witness),
        LIVENESS_S + 3,
        "instances moved away",
    )
    cluster.restart(victim)
    wait_until(
        lambda: len(cluster.get(witness, "/admin/v2/worker/cluster")) == 3,
        10,
        "the worker rejoined",
    )
    assert httpx.put(f"{victim.url}/admin/v2/worker/rebalance", timeout=10).status_code == 204
    wait_until(
        lambda: sorted(len(k) for k in cluster.assignments(witness).values()) == [2, 2, 2],
        10,
        "a fair share for every worker",
    )
    wait_until(lambda: running(cluster, witness, "spread") == 6, 10, "all running")


@pytest.mark.brokers("lite", "apache")
def test_a_paused_leader_cannot_corrupt_the_cluster(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    workers = cluster.start(3)
    old_leader = cluster.leader_id(workers[0])
    leader = next(w for w in workers if w.worker_id == old_leader)
    others = [w for w in workers if w is not leader]
    leader.process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: cluster.leader_id(others[0]) != old_leader, 20, "a new leader")
        assert (
            cluster.create(
                others[0], "after-pause", inputs=[f"in-{uuid.uuid4().hex[:6]}"]
            ).status_code
            == 204
        )
    finally:
        leader.process.send_signal(SIGCONT)
    # What the old leader could still send, believing it leads term 1: a delete and an
    # assignment that moves everything to itself. Both must be ignored everywhere.
    system = f"persistent://public/{cluster.namespace}"
    metadata = cluster_client.create_producer(f"{system}/metadata")
    metadata.send(
        b"",
        properties={
            "type": "function",
            "fqfn": "public/default/after-pause",
            "term": "1",
            "leader": old_leader,
            "version": "99",
        },
    )
    stale = {
        "term": 1,
        "version": 99,
        "leader": {"workerId": old_leader, "adminUrl": leader.url},
        "workers": [],
        "assignment": {"public/default/after-pause:0": old_leader},
    }
    cluster_client.create_producer(f"{system}/assignments").send(json.dumps(stale).encode())
    time.sleep(2)
    for worker in workers:
        assert "after-pause" in cluster.get(worker, "/admin/v3/functions/public/default")
        owners = cluster.assignments(worker)
        assert any("public/default/after-pause:0" in keys for keys in owners.values())
    # one leader, the same for everyone; on Apache Pulsar the resumed worker's reconnect may
    # move the Failover subscription (a hash of the consumers' names) once more: a new term
    wait_until(
        lambda: len({cluster.leader_id(w) for w in workers}) == 1, 15, "one leader for everyone"
    )
    wait_until(lambda: running(cluster, others[0], "after-pause") == 1, 10, "still running")


@pytest.mark.brokers("lite", "apache")
def test_restart_of_all_workers_restores_every_function(cluster: Cluster) -> None:
    workers = cluster.start(3)
    topic = f"in-{uuid.uuid4().hex[:6]}"
    assert cluster.create(workers[0], "durable", inputs=[topic], parallelism=2).status_code == 204
    wait_until(lambda: running(cluster, workers[0], "durable") == 2, 10, "running")
    stop = httpx.post(
        f"{workers[1].url}/admin/v3/functions/public/default/durable/1/stop", timeout=10
    )
    assert stop.status_code == 204, stop.text
    wait_until(lambda: running(cluster, workers[0], "durable") == 1, 10, "instance 1 stopped")
    for worker in workers:
        worker.process.terminate()
    for worker in workers:
        worker.process.wait(60)
    restarted = [cluster.restart(w, wait=False) for w in workers]  # side by side
    for worker in restarted:
        cluster.wait_ready(worker)
    wait_until(lambda: running(cluster, restarted[2], "durable") == 1, 15, "function back")
    status = cluster.status(restarted[0], "durable")
    assert [i["status"]["running"] for i in status["instances"]] == [True, False]
    config = cluster.get(restarted[1], "/admin/v3/functions/public/default/durable")
    assert config["inputs"] == [topic] and config["parallelism"] == 2


def test_a_crashed_instance_is_restarted_and_counted(cluster: Cluster) -> None:
    worker = cluster.start_worker("solo")
    assert (
        cluster.create(worker, "fragile", inputs=[f"in-{uuid.uuid4().hex[:6]}"]).status_code == 204
    )
    wait_until(lambda: running(cluster, worker, "fragile") == 1, 10, "running")
    instance_pids = instance_processes(worker)
    assert len(instance_pids) == 1, instance_pids
    subprocess.run(["kill", "-9", instance_pids[0]], check=True)
    wait_until(
        lambda: cluster.status(worker, "fragile")["instances"][0]["status"]["numRestarts"] == 1,
        10,
        "restart counted",
    )
    wait_until(lambda: running(cluster, worker, "fragile") == 1, 10, "running again")


@pytest.mark.brokers("lite", "apache")
def test_update_scales_and_restarts_and_delete_stops(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("solo")
    topic = f"in-{uuid.uuid4().hex[:6]}"
    assert (
        cluster.create(
            worker,
            "evolving",
            inputs=[topic],
            output=f"{topic}-out",
            subscriptionPosition="Earliest",
        ).status_code
        == 204
    )
    wait_until(lambda: running(cluster, worker, "evolving") == 1, 10, "running")
    base = f"{worker.url}/admin/v3/functions/public/default/evolving"
    scaled = httpx.put(base, data={"functionConfig": json.dumps({"parallelism": 3})}, timeout=30)
    assert scaled.status_code == 204, scaled.text
    wait_until(lambda: running(cluster, worker, "evolving") == 3, 10, "scaled to 3")
    new_code = "def process(input):\n    return input + '?'\n"
    updated = httpx.put(
        base,
        data={"functionConfig": json.dumps({"className": None})},
        files={"data": ("question.py", new_code.encode())},
        timeout=30,
    )
    assert updated.status_code == 204, updated.text
    producer = cluster_client.create_producer(topic)
    consumer = cluster_client.subscribe(
        f"{topic}-out", "check", initial_position=pulsar.InitialPosition.Earliest
    )

    def answered() -> bool:
        producer.send(b"hi")
        try:
            return bool(consumer.receive(500).data() == b"hi?")
        except pulsar.Timeout:
            return False

    wait_until(answered, 15, "the new code answering")
    assert httpx.delete(base, timeout=30).status_code == 204
    assert httpx.get(base, timeout=10).status_code == 404
    wait_until(lambda: cluster.assignments(worker) == {}, 10, "no instance assigned")
    wait_until(lambda: instance_processes(worker) == [], 10, "instance processes gone")


def test_drain_moves_every_instance_off_a_worker(cluster: Cluster) -> None:
    workers = cluster.start(3)
    assert (
        cluster.create(
            workers[0], "movable", inputs=[f"in-{uuid.uuid4().hex[:6]}"], parallelism=3
        ).status_code
        == 204
    )
    wait_until(lambda: running(cluster, workers[0], "movable") == 3, 10, "running")
    target = workers[2]
    drained = httpx.put(
        f"{workers[1].url}/admin/v2/worker/leader/drain",
        params={"workerId": target.worker_id},
        timeout=10,
    )
    assert drained.status_code == 204, drained.text
    wait_until(lambda: target.worker_id not in cluster.assignments(workers[0]), 10, "drained")
    status = cluster.get(workers[0], f"/admin/v2/worker/leader/drain?workerId={target.worker_id}")
    assert status == {"workerId": target.worker_id, "status": "SUCCESS", "instancesLeft": 0}
    wait_until(lambda: running(cluster, workers[0], "movable") == 3, 10, "running elsewhere")


def test_errors_name_the_cause(cluster: Cluster) -> None:
    worker = cluster.start_worker("solo")
    missing = httpx.get(f"{worker.url}/admin/v3/functions/public/default/nope/status", timeout=10)
    assert missing.status_code == 404
    assert missing.json() == {"reason": "Function nope doesn't exist"}
    invalid = cluster.create(worker, "bad", inputs=["same"], output="same")
    assert invalid.status_code == 400
    assert "is also an input topic" in invalid.json()["reason"]
    broken = httpx.post(
        f"{worker.url}/admin/v3/functions/public/default/broken",
        data={"functionConfig": json.dumps({"inputs": ["x"]})},
        files={"data": ("broken.py", b"def process(input)\n")},
        timeout=30,
    )
    assert broken.status_code == 400
    assert broken.json()["reason"].startswith("syntax error in broken.py, line 1")
