"""The leader's duties: take over with a new term, write metadata, keep the assignment current.

A worker becomes leader when its coordination consumer turns active. It first catches up on
the metadata and assignments topics, then takes term = highest term seen + 1 and marks it on
the metadata topic (fencing: the broker may not enforce exclusive producers, so records of
a deposed leader are recognized by their lower term). A leader that lost the subscription
for a moment and got it back before any other worker took a term leads its term again. From
then on it reschedules whenever functions, members, drains, a rebalance request or the
instances the workers report running change what should run where: the scheduler is told
which instances do not run yet where they are assigned, so that it moves instances a few at
a time (see ``magnetar.worker.scheduler``). A function that admission does not let through
(an invalid config, a parallelism past the limit) is left out with a logged reason: one bad
record never stops the scheduling of the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from magnetar.worker.admission import Admission
from magnetar.worker.assignments import AssignmentManager, AssignmentRecord
from magnetar.worker.exceptions import AdmissionError, NotLeaderError
from magnetar.worker.metadata import Entry, FunctionRecord, MetadataManager
from magnetar.worker.model import WorkerInfo, WorkerReport, instance_key
from magnetar.worker.scheduler import Scheduler

__all__ = ["LeaderService", "LeadershipView"]

log = logging.getLogger(__name__)


class LeadershipView(Protocol):
    """What the leader needs of the membership (``magnetar.worker.membership.Membership``)."""

    @property
    def is_leader(self) -> bool:
        """Whether this worker holds the coordination subscription."""
        ...

    def members(self) -> list[WorkerInfo]:
        """The live workers, sorted by id."""
        ...

    def reports(self) -> dict[str, WorkerReport]:
        """The latest report of each live worker heard from."""
        ...


class LeaderService:
    """Runs on every worker; acts only while this worker is the leader."""

    def __init__(
        self,
        me: WorkerInfo,
        membership: LeadershipView,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        scheduler: Scheduler,
        write_timeout_s: float,
        admission: Admission | None = None,
    ) -> None:
        """``admission``: which functions may be scheduled (the default limits when None)."""
        self._me = me
        self._admission = admission or Admission()
        self._refused: dict[str, int] = {}
        """Functions left out of the schedule, by the record version last logged."""
        self._membership = membership
        self._metadata = metadata
        self._assignments = assignments
        self._scheduler = scheduler
        self._timeout = write_timeout_s
        self._term: int | None = None
        self._lost_term: int | None = None
        """The term this worker led until it lost the subscription, to lead it again."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rebalance_requested = False
        self._draining: set[str] | None = None
        self._thread = threading.Thread(target=self._run, name="leader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def notify(self) -> None:
        """Something changed (functions, members): reschedule soon, if leader."""
        self._wake.set()

    def on_leadership(self, leader: bool) -> None:
        self._wake.set()

    @property
    def worker_id(self) -> str:
        return self._me.worker_id

    @property
    def term(self) -> int | None:
        """The term this worker leads, None when it is not an established leader."""
        return self._term

    # --- requests -----------------------------------------------------------------------

    def write_function(
        self, fqfn: str, change: Callable[[FunctionRecord | None], FunctionRecord | None]
    ) -> FunctionRecord | None:
        """Replicate a change to one function; NotLeaderError on any other worker."""
        term = self._term
        if term is None:
            raise NotLeaderError(f"{self._me.worker_id} is not the leader")
        record = self._metadata.write(term, self._me.worker_id, fqfn, change, self._timeout)
        self.notify()
        return record

    def write_entry(
        self, kind: str, key: str, change: Callable[[Entry | None], Entry | None]
    ) -> Entry | None:
        """Replicate a change to a tenant or namespace; NotLeaderError on any other worker."""
        term = self._term
        if term is None:
            raise NotLeaderError(f"{self._me.worker_id} is not the leader")
        return self._metadata.write_entry(
            term, self._me.worker_id, kind, key, change, self._timeout
        )

    def rebalance(self) -> None:
        self._require_leader()
        with self._lock:
            self._rebalance_requested = True
        self.notify()

    def drain(self, worker_id: str, drain: bool = True) -> None:
        """Move every instance off ``worker_id`` and give it none (``drain=False`` undoes)."""
        self._require_leader()
        with self._lock:
            draining = set(self._current_draining())
            if drain:
                draining.add(worker_id)
            else:
                draining.discard(worker_id)
            self._draining = draining
        self.notify()

    def draining(self) -> set[str]:
        with self._lock:
            return set(self._current_draining())

    def _current_draining(self) -> set[str]:
        if self._draining is not None:
            return self._draining
        current = self._assignments.current
        return set(current.draining) if current else set()

    def _require_leader(self) -> None:
        if self._term is None:
            raise NotLeaderError(f"{self._me.worker_id} is not the leader")

    # --- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self._step()
            except NotLeaderError as error:
                log.warning("stepping down: %s", error)
                self._term = None
            except Exception:
                log.exception("leader step failed; retrying")
                self._stop.wait(0.5)
                self._wake.set()

    def _step(self) -> None:
        if not self._membership.is_leader:
            if self._term is not None:
                log.info("%s stepped down from term %d", self._me.worker_id, self._term)
                self._lost_term, self._term = self._term, None
                self._draining = None
            return
        if self._term is None:
            self._take_over()
        elif self._superseded(self._term):
            raise NotLeaderError(f"a leader with a newer term than {self._term} exists")
        self._reschedule()

    def _take_over(self) -> None:
        if not (
            self._metadata.catch_up(self._timeout) and self._assignments.catch_up(self._timeout)
        ):
            raise NotLeaderError("cannot catch up with the metadata and assignments topics")
        current = self._assignments.current
        lost, self._lost_term = self._lost_term, None
        if lost is not None and not self._superseded(lost):
            term = lost
            log.info("%s leads term %d again: no other leader took over", self._me.worker_id, term)
        else:
            term = max(self._metadata.highest_term, current.term if current else 0) + 1
            if not self._metadata.mark_term(term, self._me.worker_id, self._timeout):
                raise NotLeaderError(f"another worker claimed term {term} first")
            log.info("%s leads term %d", self._me.worker_id, term)
        self._term = term
        self._draining = set(current.draining) if current else set()

    def _superseded(self, term: int) -> bool:
        """Whether another leader has taken a term after ``term`` (or ``term`` itself)."""
        current = self._assignments.current
        newer_assignment = current is not None and current.term > term
        owner = self._metadata.term_owner()
        return newer_assignment or owner != (term, self._me.worker_id)

    def _reschedule(self) -> None:
        term = self._term
        assert term is not None
        with self._lock:
            rebalance, self._rebalance_requested = self._rebalance_requested, False
            draining = set(self._current_draining())
        members = self._membership.members()
        eligible = [w.worker_id for w in members if w.worker_id not in draining]
        functions = self._metadata.functions()
        self._refused = {f: v for f, v in self._refused.items() if f in functions}
        # stopped instances keep their place (as in Pulsar): their worker stops them, tells
        # the truth about them until their process has exited, and starts them again there
        instances = [
            instance_key(fqfn, i)
            for fqfn, record in sorted(functions.items())
            for i in range(self._scheduled_parallelism(record))
        ]
        current = self._assignments.current
        in_force = current.assignment if current else {}
        assignment = self._scheduler.schedule(
            instances,
            in_force,
            eligible,
            rebalance=rebalance,
            unsettled=self._unsettled(current),
        )
        unchanged = (
            current is not None
            and current.term == term
            and current.assignment == assignment
            and current.workers == members
            and set(current.draining) == draining
        )
        if unchanged:
            return
        version = current.version + 1 if current is not None and current.term == term else 1
        record = AssignmentRecord(term, version, self._me, members, assignment, sorted(draining))
        self._assignments.write(record, self._timeout)
        moved = sum(1 for key, worker in assignment.items() if in_force.get(key, worker) != worker)
        log.info(
            "assignment v%d of term %d: %d instances on %d workers (%d moved)",
            version,
            term,
            len(assignment),
            len(eligible),
            moved,
        )

    def _scheduled_parallelism(self, record: FunctionRecord) -> int:
        """The instances of ``record`` to schedule: none, with the reason logged once per
        version, when admission does not let it through."""
        try:
            parallelism = self._admission.scheduled_parallelism(record)
        except AdmissionError as error:
            if self._refused.get(record.fqfn) != record.version:
                self._refused[record.fqfn] = record.version
                log.error(
                    "function %s (version %d) is not scheduled: %s",
                    record.fqfn,
                    record.version,
                    error.reason,
                )
            return 0
        self._refused.pop(record.fqfn, None)
        return parallelism

    def _unsettled(self, current: AssignmentRecord | None) -> set[str]:
        """The instances of ``current`` not known to run where it puts them: those its
        workers report starting, and all of a worker that has not reported it yet."""
        if current is None:
            return set()
        reports = self._membership.reports()
        applied = (current.term, current.version)
        unsettled: set[str] = set()
        for key, worker_id in current.assignment.items():
            report = reports.get(worker_id)
            if report is None or report.assignment != applied or key in report.starting:
                unsettled.add(key)
        return unsettled
