"""Chaos on a three-worker cluster under a steady stream: kill -9 of workers together with their
instance processes, and a restart of the embedded broker. Every input must have its output.

A process killed while the broker writes to it ends its connection in a reset, and pulsar-lite
0.2 then keeps its consumers (with the messages they were handed) on their subscriptions; the
broker's healer restarts the broker, which these tests rely on: no `functions restart` here.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from magnetar.testing.stream import Stream
from tests.cluster.conftest import Cluster, Worker, wait_until

PARALLELISM = 3
RATE = 300.0
FAILOVER_S = 15.0
"""Time allowed from a kill -9 until every instance runs on the survivors (liveness 3 s)."""


@pytest.fixture
def stream(
    cluster: Cluster, cluster_client: pulsar.Client
) -> Iterator[tuple[list[Worker], Stream]]:
    """Three workers running "chaos" (parallelism 3, Shared) and a stream into it."""
    workers = cluster.start(3)
    topic = f"chaos-{uuid.uuid4().hex[:6]}"
    created = cluster.create(
        workers[0],
        "chaos",
        inputs=[topic],
        output=f"{topic}-out",
        parallelism=PARALLELISM,
        subscriptionPosition="Earliest",
    )
    assert created.status_code == 204, created.text
    wait_until(lambda: all_running(cluster, workers[0]), 20, "three instances running")
    running = Stream(cluster_client, topic, f"{topic}-out", rate=RATE).start()
    yield workers, running
    running.close()


def all_running(cluster: Cluster, via: Worker) -> bool:
    return cluster.num_running(via, "chaos") == PARALLELISM


def spread(cluster: Cluster, via: Worker) -> list[int]:
    """Instances per live worker, fewest first."""
    owners = cluster.assignments(via)
    return sorted(len(owners.get(w.worker_id, [])) for w in cluster.alive())


def assert_every_input_has_its_output(stream: Stream) -> None:
    stream.stop()
    assert not stream.failed_sends, stream.failed_sends
    if not stream.wait_complete(60):
        missing = stream.missing()
        raise AssertionError(
            f"{len(missing)} of {len(stream.sent)} inputs have no output: {missing[:20]}"
        )


def test_kill_9_of_workers_with_their_instances_loses_nothing(
    cluster: Cluster, stream: tuple[list[Worker], Stream]
) -> None:
    workers, inputs = stream
    for _ in range(2):
        time.sleep(2)
        leader = cluster.leader_id(workers[0])
        owners = cluster.assignments(workers[0])
        victim = next(w for w in workers if w.worker_id != leader and owners.get(w.worker_id))
        victim.kill(with_instances=True)
        witness = next(w for w in cluster.alive())
        wait_until(
            lambda v=victim, w=witness: (
                v.worker_id not in cluster.assignments(w) and all_running(cluster, w)
            ),
            FAILOVER_S,
            f"{victim.worker_id}'s instances running on the others",
        )
        assert max(spread(cluster, witness)) - min(spread(cluster, witness)) <= 1
        restarted = cluster.restart(victim)
        workers[workers.index(victim)] = restarted
        wait_until(
            lambda w=witness: len(cluster.get(w, "/admin/v2/worker/cluster")) == 3,
            10,
            "the killed worker back in the membership",
        )
    assert_every_input_has_its_output(inputs)


def test_a_broker_restart_under_a_stream_loses_nothing(
    cluster: Cluster,
    cluster_broker: EmbeddedBroker,
    cluster_client: pulsar.Client,
    stream: tuple[list[Worker], Stream],
) -> None:
    workers, inputs = stream
    # and a word count whose state journal lives on the broker too
    words = f"words-{uuid.uuid4().hex[:6]}"
    created = cluster.create(
        workers[1],
        "wc",
        "word_count.py",
        className="word_count.WordCountFunction",
        inputs=[words],
        processingGuarantees="EFFECTIVELY_ONCE",
        subscriptionPosition="Earliest",
    )
    assert created.status_code == 204, created.text
    lines = [f"restart {'again ' * (i % 3)}n{i % 7}" for i in range(600)]
    expected = Counter(word for line in lines for word in line.split())
    producer = cluster_client.create_producer(words, block_if_queue_full=True)
    for line in lines[:300]:
        producer.send_async(line.encode(), None)
    time.sleep(2)
    leader = cluster.leader_id(workers[0])
    cluster_broker.restart()
    for line in lines[300:]:
        producer.send_async(line.encode(), None)
    producer.flush()
    wait_until(lambda: all_running(cluster, workers[1]), 10, "every instance running")
    assert {cluster.leader_id(w) for w in workers} == {leader}
    assert_every_input_has_its_output(inputs)
    wait_until(lambda: counts(workers[2], list(expected)) == expected, 30, "exact word counts")
    # the control plane works as before: a new function runs
    topic = f"after-{uuid.uuid4().hex[:6]}"
    created = cluster.create(workers[2], "after", inputs=[topic], output=f"{topic}-out")
    assert created.status_code == 204, created.text
    wait_until(lambda: cluster.num_running(workers[0], "after") == 1, 10, "the new function runs")


def counts(worker: Worker, words: list[str]) -> dict[str, int]:
    found = {}
    for word in words:
        response = httpx.get(f"{worker.url}/admin/v3/functions/public/default/wc/state/{word}")
        if response.status_code == 200:
            found[word] = response.json()["numberValue"]
    return found
