"""Failover that keeps four workers balanced: a dead worker's instances spread over the
others, and it gets its share back when it returns, with no change of leader or term."""

from __future__ import annotations

import subprocess
import uuid
from collections import Counter

from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.cluster.test_cluster import LIVENESS_S, instance_processes, running

FUNCTIONS = ("alpha", "beta")


def loads(assignments: dict[str, list[str]]) -> dict[str, int]:
    return {worker: len(keys) for worker, keys in assignments.items() if keys}


def owners(assignments: dict[str, list[str]]) -> dict[str, str]:
    return {key: worker for worker, keys in assignments.items() for key in keys}


def all_running(cluster: Cluster, via: Worker) -> bool:
    return all(running(cluster, via, name) == 4 for name in FUNCTIONS)


def kill_machine(worker: Worker) -> None:
    """kill -9 of the worker and its instance processes, as when its machine dies."""
    instances = instance_processes(worker)
    worker.kill()
    if instances:
        subprocess.run(["kill", "-9", *instances], check=False)


def test_a_dead_workers_instances_spread_and_it_gets_its_share_back(cluster: Cluster) -> None:
    workers = cluster.start(4)
    for name in FUNCTIONS:
        created = cluster.create(
            workers[0], name, inputs=[f"in-{uuid.uuid4().hex[:6]}"], parallelism=4
        )
        assert created.status_code == 204, created.text
    wait_until(lambda: all_running(cluster, workers[0]), 60, "eight instances running")
    assert sorted(loads(cluster.assignments(workers[0])).values()) == [2, 2, 2, 2]
    leader = cluster.leader_id(workers[0])
    victim = next(w for w in workers if w.worker_id != leader)
    witness = next(w for w in workers if w.worker_id == leader)

    kill_machine(victim)

    wait_until(
        lambda: (
            victim.worker_id not in cluster.assignments(witness) and all_running(cluster, witness)
        ),
        LIVENESS_S + 30,
        "the dead worker's instances running elsewhere",
    )
    after_kill = cluster.assignments(witness)
    assert sorted(loads(after_kill).values()) == [2, 3, 3]  # within one of even
    assert cluster.leader_id(witness) == leader

    cluster.restart(victim)

    wait_until(
        lambda: sorted(loads(cluster.assignments(witness)).values()) == [2, 2, 2, 2],
        60,
        "the returning worker's share",
    )
    wait_until(lambda: all_running(cluster, witness), 60, "eight instances running")
    back = owners(cluster.assignments(witness))
    moved = {key for key, worker in owners(after_kill).items() if back[key] != worker}
    assert len(moved) == 2 and {back[key] for key in moved} == {victim.worker_id}
    # one instance of each function moved at a time: neither stopped altogether
    assert Counter(key.rpartition(":")[0] for key in moved) == {
        "public/default/alpha": 1,
        "public/default/beta": 1,
    }
    assert cluster.leader_id(witness) == leader
    logs = {w.worker_id: w.log_text() for w in workers}
    assert "leads term 1" in logs[leader]
    for worker_id, text in logs.items():
        for sign in ("leads term 2", "stepping down", "stepped down"):
            assert sign not in text, f"{worker_id}: {sign}"
        # at info, a worker does not log the requests it sends other workers twice a second,
        # nor the client library's expected errors on the embedded broker
        assert "HTTP Request:" not in text, worker_id
        assert "Failed to getLastMessageId: UnknownError" not in text, worker_id
