"""The leader on real metadata and assignments topics, with the membership it is given
(the ``LeadershipView`` seam): terms across a lost and regained subscription, and balancing
paced by what the workers report running."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pulsar
import pytest

from magnetar.worker.assignments import AssignmentManager, AssignmentRecord
from magnetar.worker.leader import LeaderService
from magnetar.worker.metadata import FunctionRecord, MetadataManager
from magnetar.worker.model import WorkerInfo, WorkerReport
from magnetar.worker.scheduler import LeastLoadedStickyScheduler

ME = WorkerInfo("w1", "http://w1")


@dataclass
class View:
    """The membership as the test sets it."""

    is_leader: bool = False
    workers: list[str] = field(default_factory=lambda: ["w1"])
    report_of: dict[str, WorkerReport] = field(default_factory=dict)

    def members(self) -> list[WorkerInfo]:
        return [WorkerInfo(worker_id, f"http://{worker_id}") for worker_id in sorted(self.workers)]

    def reports(self) -> dict[str, WorkerReport]:
        return dict(self.report_of)


@dataclass
class Cluster:
    view: View
    leader: LeaderService
    metadata: MetadataManager
    assignments: AssignmentManager

    def current(self) -> AssignmentRecord:
        record = self.assignments.current
        assert record is not None
        return record

    def assigned(self) -> dict[str, str]:
        """The assignment in force (empty before the first)."""
        record = self.assignments.current
        return {} if record is None else record.assignment

    def loads(self) -> dict[str, int]:
        return dict(Counter(self.assigned().values()))

    def report_all_running(self) -> None:
        """Every worker has applied the assignment in force and runs its instances."""
        record = self.current()
        self.view.report_of = {
            worker_id: WorkerReport((record.term, record.version))
            for worker_id in self.view.workers
        }
        self.leader.notify()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


@pytest.fixture
def cluster(client: pulsar.Client, topic: str) -> Iterator[Cluster]:
    metadata = MetadataManager(client, f"persistent://public/default/{topic}-metadata")
    assignments = AssignmentManager(client, f"persistent://public/default/{topic}-assignments")
    view = View()
    leader = LeaderService(
        ME, view, metadata, assignments, LeastLoadedStickyScheduler(), write_timeout_s=10
    )
    for part in (metadata, assignments, leader):
        part.start()
    yield Cluster(view, leader, metadata, assignments)
    for part in (leader, assignments, metadata):
        part.stop()


def create(cluster: Cluster, name: str, parallelism: int) -> None:
    fqfn = f"public/default/{name}"
    config = {"name": name, "inputs": ["in"], "parallelism": parallelism}
    cluster.leader.write_function(fqfn, lambda _: FunctionRecord(fqfn, config, None))


def test_a_leader_that_gets_the_subscription_back_keeps_its_term(cluster: Cluster) -> None:
    cluster.view.is_leader = True
    cluster.leader.notify()
    wait_for(lambda: cluster.leader.term == 1, "term 1")
    create(cluster, "f", 2)
    wait_for(lambda: len(cluster.assigned()) == 2, "f assigned")

    cluster.view.is_leader = False  # the broker handed the subscription on for a moment
    cluster.leader.notify()
    wait_for(lambda: cluster.leader.term is None, "stepped down")
    cluster.view.is_leader = True
    cluster.leader.notify()
    wait_for(lambda: cluster.leader.term == 1, "term 1 again")

    create(cluster, "g", 1)
    wait_for(lambda: len(cluster.assigned()) == 3, "g assigned")
    assert cluster.current().term == 1
    assert cluster.metadata.term_owner() == (1, "w1")


def test_a_leader_whose_term_was_taken_meanwhile_takes_a_newer_one(cluster: Cluster) -> None:
    cluster.view.is_leader = True
    cluster.leader.notify()
    wait_for(lambda: cluster.leader.term == 1, "term 1")

    cluster.view.is_leader = False
    cluster.leader.notify()
    wait_for(lambda: cluster.leader.term is None, "stepped down")
    assert cluster.metadata.mark_term(2, "w2", timeout=10)  # another worker led meanwhile
    cluster.view.is_leader = True
    cluster.leader.notify()

    wait_for(lambda: cluster.leader.term == 3, "term 3")
    assert cluster.metadata.term_owner() == (3, "w1")


def test_a_joining_worker_gets_its_share_as_the_moved_instances_start(cluster: Cluster) -> None:
    cluster.view.is_leader = True
    cluster.view.workers = ["w1", "w2"]
    cluster.leader.notify()
    wait_for(lambda: cluster.leader.term == 1, "term 1")
    create(cluster, "f", 6)
    wait_for(lambda: cluster.loads() == {"w1": 3, "w2": 3}, "six instances on two workers")
    cluster.report_all_running()

    cluster.view.workers = ["w1", "w2", "w3"]  # w3 joins; its heartbeat reports nothing yet
    cluster.view.report_of["w3"] = WorkerReport(None)
    cluster.leader.notify()
    # One instance of f moves, so that f keeps running on the others; the next waits until
    # w3 reports it running.
    wait_for(lambda: cluster.loads().get("w3") == 1, "a first step onto w3")
    first = cluster.current()
    (moved,) = [key for key, worker in first.assignment.items() if worker == "w3"]
    time.sleep(1.5)  # the leader reschedules every second: still waiting
    assert cluster.current().version == first.version

    cluster.report_all_running()

    wait_for(lambda: cluster.loads() == {"w1": 2, "w2": 2, "w3": 2}, "an even spread")
    final = cluster.current()
    assert final.version == first.version + 1
    assert final.assignment[moved] == "w3"
    before = {key: worker for key, worker in first.assignment.items() if key != moved}
    assert sum(1 for key, worker in before.items() if final.assignment[key] != worker) == 1
