"""Timers (createTimer/cancelTimer) on real workers: fired, cancelled, replaced, past-due and
recurring timers as the output topic shows them; counters in status; the REST and CLI
listing; kept by stop/start, removed by delete; none lost to kill -9 of the leader that owns
some of them, nor to a parallelism change."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.cluster.test_cluster import instance_processes
from tests.conftest import MAGNETAR
from tests.integration.test_timers import COUNTED, every_output

FUNCTIONS = "/admin/v3/functions/public/default"


def create_reminders(cluster: Cluster, worker: Worker, name: str, **config: Any) -> tuple[str, str]:
    """The reminders example as ``name``: its input and output topics."""
    suffix = uuid.uuid4().hex[:6]
    inputs, output = f"commands-{suffix}", f"reminders-{suffix}"
    response = cluster.create(
        worker,
        name,
        "reminders.py",
        className="reminders.Reminders",
        inputs=[inputs],
        output=output,
        **config,
    )
    assert response.status_code == 204, response.text
    wait_until(lambda: cluster.num_running(worker, name) == config.get("parallelism", 1), 30, name)
    return inputs, output


def send(client: pulsar.Client, topic: str, *commands: dict[str, Any]) -> None:
    producer = client.create_producer(topic)
    for command in commands:
        producer.send(json.dumps(command).encode())
    producer.close()


def watch(client: pulsar.Client, output: str) -> Any:
    """A consumer of the function's outputs. Shared: pulsar-lite hands an Exclusive
    subscription stored messages again when a publish races its dispatch, and a Shared one
    each message once (a CI run got the two cancellations here more than once each, all
    within 40 us: handed out again, not processed again)."""
    return client.subscribe(output, "test", consumer_type=pulsar.ConsumerType.Shared)


def outputs(consumer: Any, count: int, timeout_s: float) -> list[dict[str, Any]]:
    """The next ``count`` outputs, each with the time it arrived (``received``)."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(message)
        found.append({**json.loads(message.data()), "received": time.time()})
    return found


def firings(consumer: Any, references: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Outputs until every reference has fired at least once (a firing may repeat: at least
    once)."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while {f.get("fired") for f in found} < set(references) and time.monotonic() < deadline:
        found += outputs(consumer, 1, 0.5)
    return found


def listing(worker: Worker, name: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{worker.url}{FUNCTIONS}/{name}/timers", timeout=10)
    assert response.status_code == 200, response.text
    timers: list[dict[str, Any]] = response.json()
    return timers


def instance_status(cluster: Cluster, worker: Worker, name: str) -> dict[str, Any]:
    status: dict[str, Any] = cluster.status(worker, name)["instances"][0]["status"]
    return status


@pytest.mark.brokers("lite", "apache")
def test_timers_fire_at_their_time_and_can_be_cancelled_replaced_and_recurring(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    inputs, output = create_reminders(cluster, worker, "reminders")
    consumer = watch(cluster_client, output)
    now = time.time()
    send(
        cluster_client,
        inputs,
        {"arm": "late", "at": now - 60, "note": "past due"},
        {"arm": "soon", "at": now + 1.0, "note": "first"},
        {"arm": "soon", "at": now + 1.5, "note": "replaced"},
        {"arm": "never", "at": now + 2.0, "note": "cancelled"},
        {"cancel": "never"},
        {"cancel": "unknown"},
        {"arm": "later", "at": now + 3600, "note": "pending"},
        {"every": "tick", "seconds": 0.3, "times": 3},
    )
    got = outputs(consumer, 7, 20)
    fired = [o for o in got if "fired" in o]
    cancelled = [o for o in got if "cancelled" in o]
    assert cancelled == [
        {"cancelled": "never", "was_pending": True, "received": cancelled[0]["received"]},
        {"cancelled": "unknown", "was_pending": False, "received": cancelled[1]["received"]},
    ]
    by_reference: dict[str, list[dict[str, Any]]] = {}
    for firing in fired:
        by_reference.setdefault(firing["fired"], []).append(firing)
    assert sorted(by_reference) == ["late", "soon", "tick"], got
    assert [f["note"] for f in by_reference["soon"]] == ["replaced"]  # once, the latest arming
    assert by_reference["soon"][0]["at"] >= now + 1.5  # never before its time
    assert [f["left"] for f in by_reference["tick"]] == [2, 1, 0]
    ticks = [f["at"] for f in by_reference["tick"]]
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(ticks)), ticks
    # "never" was cancelled (half a second past its time now), "later" is not due
    assert outputs(consumer, 1, max(0.5, now + 2.5 - time.time())) == []

    wait_until(
        lambda: instance_status(cluster, worker, "reminders")["numTimersFired"] == 5, 10, "5"
    )
    wait_until(
        lambda: instance_status(cluster, worker, "reminders")["numTimersPending"] == 1,
        10,
        "one pending timer in status",
    )
    status = instance_status(cluster, worker, "reminders")
    reminded = httpx.get(f"{worker.url}{FUNCTIONS}/reminders/state/reminded", timeout=10)
    assert reminded.json()["numberValue"] == 2, reminded.text  # state, from the callbacks
    assert 0 <= status["timerLatenessP99Ms"] < 60_000 + 5000, status  # "late" was a minute late
    wait_until(lambda: len(listing(worker, "reminders")) == 1, 10, "the fired ones removed")
    pending = listing(worker, "reminders")
    assert [(t["reference"], t["callback"], t["payload"]) for t in pending] == [
        ("later", "remind", {"reference": "later", "note": "pending"})
    ]
    assert pending[0]["due"] == math.ceil((now + 3600) * 1000)
    cli = subprocess.run(
        [*MAGNETAR, "--admin-url", worker.url, "functions", "timers", "--name", "reminders"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "later" in cli.stdout and "remind" in cli.stdout, cli.stdout
    unknown = httpx.get(f"{worker.url}{FUNCTIONS}/nope/timers", timeout=10)
    assert (unknown.status_code, unknown.json()) == (404, {"reason": "Function nope doesn't exist"})
    too_many = httpx.get(f"{worker.url}{FUNCTIONS}/reminders/timers?limit=0", timeout=10)
    assert (too_many.status_code, too_many.json()) == (
        400,
        {"reason": "limit must be 1 to 100000, not 0"},
    )
    consumer.close()


STOPPED_DUE_S = 4
"""Time enough to stop the function first, on a busy machine."""


def test_stop_keeps_timers_which_fire_late_on_start_and_delete_removes_them(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    inputs, output = create_reminders(cluster, worker, "kept")
    consumer = watch(cluster_client, output)
    now = time.time()
    send(
        cluster_client,
        inputs,
        {"arm": "while-stopped", "at": now + STOPPED_DUE_S, "note": "late"},
        {"arm": "later", "at": now + 3600, "note": "pending"},
    )
    wait_until(lambda: len(listing(worker, "kept")) == 2, 15, "two pending timers")
    stopped = httpx.post(f"{worker.url}{FUNCTIONS}/kept/stop", timeout=30)
    assert stopped.status_code == 204, stopped.text
    wait_until(lambda: cluster.num_running(worker, "kept") == 0, 15, "stopped")
    # past its time, but the function is stopped
    assert outputs(consumer, 1, max(0.5, now + STOPPED_DUE_S + 0.5 - time.time())) == []
    started = httpx.post(f"{worker.url}{FUNCTIONS}/kept/start", timeout=30)
    assert started.status_code == 204, started.text
    fired = outputs(consumer, 1, 20)
    assert [(f["fired"], f["note"]) for f in fired] == [("while-stopped", "late")]
    assert fired[0]["at"] >= now + STOPPED_DUE_S
    wait_until(lambda: [t["reference"] for t in listing(worker, "kept")] == ["later"], 10, "1")

    deleted = httpx.delete(f"{worker.url}{FUNCTIONS}/kept", timeout=30)
    assert deleted.status_code == 204, deleted.text
    create_reminders(cluster, worker, "kept")
    assert listing(worker, "kept") == []
    consumer.close()


DUE_AFTER_S = 1.5
"""The failover timers are due soon after the kill: their lateness is the failover's."""


@pytest.mark.brokers("lite", "apache")
def test_kill_9_of_the_leader_owning_timers_loses_none(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    """The leader holds one of the function's two instances, so it owns about half of the
    timers: killed with its instances (its machine dies), the other worker takes the lead
    and the instance over, and every timer fires."""
    workers = [cluster.start_worker(f"w{i}", wait=False) for i in (1, 2)]
    for worker in workers:
        cluster.wait_ready(worker)
    wait_until(
        lambda: len(cluster.get(workers[0], "/admin/v2/worker/cluster")) == 2, 10, "membership"
    )
    inputs, output = create_reminders(cluster, workers[0], "failover", parallelism=2)
    consumer = watch(cluster_client, output)
    now = time.time()
    references = [f"r{i}" for i in range(20)]
    send(
        cluster_client,
        inputs,
        *(
            {"arm": r, "at": now + DUE_AFTER_S + i * 0.1, "note": r}
            for i, r in enumerate(references)
        ),
    )
    wait_until(lambda: len(listing(workers[0], "failover")) == 20, 15, "20 pending timers")
    leader_id = cluster.leader_id(workers[0])
    leader = next(w for w in workers if w.worker_id == leader_id)
    held = cluster.assignments(workers[0]).get(leader_id, [])
    assert any("failover" in i for i in held), held  # the leader owns timers too
    leader.kill(with_instances=True)
    survivor = next(w for w in workers if w is not leader)
    fired = firings(consumer, references, 60)
    assert sorted({f["fired"] for f in fired}) == sorted(references)
    lateness = [f["at"] - (now + DUE_AFTER_S + int(f["fired"][1:]) * 0.1) for f in fired]
    assert all(late >= 0 for late in lateness), lateness  # never before their time
    assert max(lateness) < 30, lateness  # the liveness timeout, a restart, on a busy machine
    wait_until(lambda: listing(survivor, "failover") == [], 15, "no pending timer")
    assert cluster.leader_id(survivor) == survivor.worker_id
    consumer.close()


def test_timers_move_to_their_new_owners_when_the_parallelism_changes(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    inputs, output = create_reminders(cluster, worker, "rescaled")
    consumer = watch(cluster_client, output)
    now = time.time()
    references = [f"r{i}" for i in range(12)]
    send(cluster_client, inputs, *({"arm": r, "at": now + 5, "note": r} for r in references))
    wait_until(lambda: len(listing(worker, "rescaled")) == 12, 15, "12 pending timers")
    scaled = httpx.put(
        f"{worker.url}{FUNCTIONS}/rescaled",
        data={"functionConfig": json.dumps({"parallelism": 3})},
        timeout=30,
    )
    assert scaled.status_code == 204, scaled.text
    wait_until(lambda: cluster.num_running(worker, "rescaled") == 3, 30, "three instances")
    fired = firings(consumer, references, 30)
    assert sorted({f["fired"] for f in fired}) == sorted(references)
    assert all(f["at"] >= now + 5 for f in fired)

    def fired_by_instance() -> list[int]:
        instances = cluster.status(worker, "rescaled")["instances"]
        return [i["status"]["numTimersFired"] for i in instances]

    wait_until(lambda: sum(fired_by_instance()) >= 12, 15, "the firings in status")
    assert sum(1 for n in fired_by_instance() if n) >= 2, fired_by_instance()  # spread out
    consumer.close()


EO_TIMERS = 300
EO_SPREAD_S = 3.0
"""The timers fall due over this long, so the kill lands among firings."""


@pytest.mark.brokers("apache")
def test_effectively_once_timers_fire_exactly_once_through_kill_9_of_the_instance(
    cluster: Cluster, cluster_client: pulsar.Client, tmp_path: Path
) -> None:
    """300 timers falling due over 3 s, each publishing its reference and counting; kill -9
    of the instance's process while they fire (the worker restarts it): every reference on
    the output exactly once, and the count exact."""
    worker = cluster.start_worker("w1")
    code = tmp_path / "counted.py"
    code.write_text(COUNTED)
    suffix = uuid.uuid4().hex[:6]
    inputs, output = f"arm-{suffix}", f"fired-{suffix}"
    response = cluster.create(
        worker,
        "counted",
        str(code),
        className="counted.Counted",
        inputs=[inputs],
        output=output,
        processingGuarantees="EFFECTIVELY_ONCE",
    )
    assert response.status_code == 204, response.text
    wait_until(lambda: cluster.num_running(worker, "counted") == 1, 30, "running")
    consumer = watch(cluster_client, output)
    start = time.time() + 2.0
    references = [f"r{i}" for i in range(EO_TIMERS)]
    producer = cluster_client.create_producer(inputs)
    for i, reference in enumerate(references):
        producer.send_async(f"{reference} {start + i * EO_SPREAD_S / EO_TIMERS}".encode(), None)
    producer.flush()
    producer.close()
    # a third of them fired: kill -9 the instance among the firings; the worker restarts it
    seen = outputs(consumer, EO_TIMERS // 3, 30)
    assert len(seen) == EO_TIMERS // 3, seen[-3:]
    killed = instance_processes(worker)
    subprocess.run(["kill", "-9", *killed], check=True)
    wait_until(
        lambda: cluster.status(worker, "counted")["instances"][0]["status"]["numRestarts"] >= 1,
        30,
        "the killed instance restarted",
    )
    wait_until(lambda: listing(worker, "counted") == [], 30, "every timer fired")
    fired = every_output(cluster_client, output)
    repeated = sorted({r for r in fired if fired.count(r) > 1})
    assert repeated == [], f"fired more than once: {repeated}"
    assert sorted(fired) == sorted(references), set(references) - set(fired)
    counted = httpx.get(f"{worker.url}{FUNCTIONS}/counted/state/fired", timeout=10)
    assert counted.json()["numberValue"] == EO_TIMERS, counted.text
    consumer.close()
