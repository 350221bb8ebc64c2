"""Membership on the coordination topic: one leader among the workers, and a worker that
cannot reach the leader it knows takes over (pulsar-lite 0.2 may leave a dead leader's
consumer active on the Failover subscription)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pulsar
import pytest

from magnetar.broker import find_free_port
from magnetar.client import create_client
from magnetar.worker.membership import Membership
from magnetar.worker.model import WorkerInfo

NewMembership = Callable[..., Membership]


@pytest.fixture
def coordination_topic() -> str:
    return f"coordination-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def membership(broker_url: str, coordination_topic: str) -> Iterator[NewMembership]:
    """Start memberships of one fresh coordination topic, each on a client of its own."""
    topic = coordination_topic
    started: list[tuple[Membership, pulsar.Client]] = []

    def start(
        worker_id: str,
        known_leader: Callable[[], WorkerInfo | None],
        known_workers: Callable[[], list[WorkerInfo]] = list,
        admin_url: str | None = None,
    ) -> Membership:
        client = create_client(broker_url)
        member = Membership(
            client,
            topic,
            WorkerInfo(worker_id, admin_url or f"http://127.0.0.1:{find_free_port()}"),
            heartbeat_interval_s=0.2,
            liveness_timeout_s=1.0,
            on_leadership=lambda leader: None,
            on_members_changed=lambda: None,
            known_leader=known_leader,
            known_workers=known_workers,
        )
        member.start()
        started.append((member, client))
        return member

    yield start
    for member, client in started:
        member.stop()
        client.close()


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering_leader() -> Iterator[WorkerInfo]:
    """A leader whose HTTP server answers."""
    server = HTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield WorkerInfo("w1", f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()


def test_one_leader_and_it_knows_the_members(
    membership: NewMembership, answering_leader: WorkerInfo
) -> None:
    first = membership("w1", lambda: None)
    assert wait_for(lambda: first.is_leader, 10), "the only worker did not become leader"
    second = membership("w2", lambda: answering_leader)
    assert wait_for(lambda: [w.worker_id for w in first.members()] == ["w1", "w2"], 10)
    time.sleep(3.5)  # longer than a takeover waits: a leader that answers is left alone
    assert first.is_leader and not second.is_leader
    assert second.resubscriptions == 0


def test_a_worker_that_cannot_reach_the_leader_takes_over(membership: NewMembership) -> None:
    first = membership("w1", lambda: None)
    assert wait_for(lambda: first.is_leader, 10)
    # the leader it was told of has no HTTP server: after two liveness timeouts it subscribes
    # again under a name that sorts first, and leads (as over a dead leader's consumer)
    gone = WorkerInfo("w0", f"http://127.0.0.1:{find_free_port()}")
    second = membership("w2", lambda: gone)
    assert wait_for(lambda: second.resubscriptions >= 1, 10), "no new subscription"
    assert wait_for(lambda: second.is_leader and not first.is_leader, 10), "no takeover"
    assert wait_for(lambda: [w.worker_id for w in second.members()] == ["w1", "w2"], 10)


def test_workers_take_over_one_at_a_time_in_rank_order(membership: NewMembership) -> None:
    first = membership("w1", lambda: None)
    assert wait_for(lambda: first.is_leader, 10)
    gone = WorkerInfo("w0", f"http://127.0.0.1:{find_free_port()}")
    listed = [gone, WorkerInfo("w2", "http://w2"), WorkerInfo("w3", "http://w3")]
    # w3 ranks after w2 among the workers the assignments list: it waits one liveness
    # timeout (1 s) longer, which is when w2, had it run, would already lead
    third = membership("w3", lambda: gone, lambda: listed)
    started = time.monotonic()
    assert wait_for(lambda: third.resubscriptions >= 1, 10), "no takeover"
    assert time.monotonic() - started >= 2.8, "took over before its rank's turn"
    assert wait_for(lambda: third.is_leader and not first.is_leader, 10)


def test_a_new_leader_presumes_the_workers_it_was_told_of_alive_for_a_liveness_timeout(
    membership: NewMembership,
) -> None:
    gone = WorkerInfo("w0", f"http://127.0.0.1:{find_free_port()}")  # the previous leader
    listed = [gone, WorkerInfo("w2", "http://w2"), WorkerInfo("w3", "http://w3")]
    second = membership("w2", lambda: gone, lambda: listed)

    assert wait_for(lambda: second.is_leader, 10)
    # w3 keeps its instances until it has missed its heartbeats for the liveness timeout;
    # the previous leader, the likely reason for the change, is not presumed alive
    assert [w.worker_id for w in second.members()] == ["w2", "w3"]
    assert set(second.reports()) == {"w2"}  # w3 has reported nothing
    assert wait_for(lambda: [w.worker_id for w in second.members()] == ["w2"], 3)


def client_past_the_workers_ids(broker_url: str) -> pulsar.Client:
    """A client whose consumer ids follow those of every worker's client: pulsar-lite tells
    the consumers of a subscription apart by the id the client chose, and refuses (times
    out) a second one with the same id. A worker's client starts at a random id below 128."""
    client = create_client(broker_url)
    spent = f"non-persistent://public/default/ids-{uuid.uuid4().hex[:8]}"
    for _ in range(256):
        client.create_reader(spent, pulsar.MessageId.latest).close()
    return client


def test_the_leader_that_receives_no_heartbeats_takes_the_subscription_back(
    membership: NewMembership,
    answering_leader: WorkerInfo,
    broker_url: str,
    coordination_topic: str,
) -> None:
    first = membership("w1", lambda: answering_leader, admin_url=answering_leader.admin_url)
    second = membership("w2", lambda: answering_leader)
    assert wait_for(lambda: first.is_leader, 10)
    # A consumer that sorts first and never reads takes the subscription, as the dead
    # consumer of a reset connection keeps it; w1 answers, so w2 leaves it alone.
    ghost_client = client_past_the_workers_ids(broker_url)
    try:
        ghost_client.subscribe(
            coordination_topic,
            "participants",
            consumer_type=pulsar.ConsumerType.Failover,
            consumer_name="0-ghost",
        )
        assert wait_for(lambda: not first.is_leader, 5), "the ghost did not take over"

        assert wait_for(lambda: first.resubscriptions == 1, 10), "no takeover by the leader"
        assert wait_for(lambda: first.is_leader, 5)
        assert not second.is_leader and second.resubscriptions == 0
    finally:
        ghost_client.close()


def test_a_moment_with_the_subscription_is_no_claim_to_the_leadership(
    membership: NewMembership, broker_url: str, coordination_topic: str
) -> None:
    # What a standby worker sees when the leader's connection drops and comes back: the
    # broker hands it the subscription for a moment. Here consumers that sort first and
    # never read play the leader.
    holders = client_past_the_workers_ids(broker_url)

    def hold(name: str) -> pulsar.Consumer:
        return holders.subscribe(
            coordination_topic,
            "participants",
            consumer_type=pulsar.ConsumerType.Failover,
            consumer_name=name,
        )

    try:
        first = hold("0-holder")
        standby = membership("w2", lambda: None)
        time.sleep(1.5)
        assert not standby.is_leader
        first.close()
        time.sleep(0.3)  # the standby receives fresh heartbeats for this long
        hold("0-holder-back")

        assert not wait_for(lambda: standby.is_leader, 3), "a moment made it leader"
    finally:
        holders.close()
    # once the subscription stays with it, it leads
    assert wait_for(lambda: standby.is_leader, 5)
