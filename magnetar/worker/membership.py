"""Membership and leader election on the coordination topic.

Every worker publishes a heartbeat (its id, admin URL and a report on its instances) every
``heartbeat_interval`` and consumes the topic through one Failover subscription. The broker
delivers to exactly one consumer, so receiving fresh heartbeats means being the leader, and
the heartbeats tell the leader who is alive. Heartbeats carry their send time: old ones (a
backlog handed to a new leader, or prefetched by a worker that was paused) prove nothing and
are dropped.

A worker claims the leadership only once fresh heartbeats have kept arriving, without a
break, for two heartbeat intervals (at the first one when it took over, see below). When
the leader's connection to the broker drops and comes back (a broker restart, a keep-alive
timeout under load), the broker hands the subscription to the next consumer for a moment
and back to the leader's, whose name sorts first: a worker that claimed on the first
heartbeat of that moment would take a new term and depose a leader that never died. Those
two intervals also let a new leader hear from every live worker before it schedules. It
presumes alive, for one liveness timeout, the workers of the assignment in force it has not
heard from yet (all but the previous leader, whose loss is the likely reason for the
change), so a slow heartbeat does not move their instances.

pulsar-lite 0.2 never removes a consumer whose connection was reset (its process killed
while the broker wrote to it), and makes active the consumer whose name sorts first: a dead
leader's consumer could hold the subscription for good. So a worker that cannot reach the
leader it knows (from the assignments) for ``liveness_timeout`` times two (time for the
broker to drop a dead leader and for its successor to publish assignments) plus its rank
among the other workers the assignments list (so that they take over one at a time, each
seeing whether the one before succeeded), subscribes again under a *takeover* name, which
sorts before every worker's first name and, among takeovers, puts the newest first: it
becomes the leader. The known leader itself does the same when it receives no heartbeats
for as long (its own consumer's connection was reset, and the dead consumer the broker kept
holds the subscription): the others see it answer and would never take over.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pulsar

from magnetar.client import newest_first, subscribe
from magnetar.worker.cluster_key import RecordSeal
from magnetar.worker.model import WorkerInfo, WorkerReport

__all__ = ["Membership"]

log = logging.getLogger(__name__)

_SUBSCRIPTION = "participants"
_HEARTBEAT = "heartbeat"
"""The kind a heartbeat's seal names (a record of another topic does not pass for one)."""


class Membership:
    """This worker's heartbeats, and, while it is leader, the live members."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        me: WorkerInfo,
        heartbeat_interval_s: float,
        liveness_timeout_s: float,
        on_leadership: Callable[[bool], None],
        on_members_changed: Callable[[], None],
        known_leader: Callable[[], WorkerInfo | None] = lambda: None,
        known_workers: Callable[[], list[WorkerInfo]] = list,
        report: Callable[[], WorkerReport] = lambda: WorkerReport(None),
        seal: RecordSeal | None = None,
    ) -> None:
        """``seal``: the cluster's, for heartbeats; None sends and accepts unsealed ones."""
        self._client = client
        self._topic = topic
        self.me = me
        self._interval = heartbeat_interval_s
        self._liveness = liveness_timeout_s
        # Leadership is lost quickly (a few missed heartbeats) so two leaders overlap little.
        self._leadership_timeout = max(3 * heartbeat_interval_s, 1.0)
        # A claim needs an unbroken run of fresh heartbeats (each worker sends one per
        # interval, so a gap of two means the run broke) this long.
        self._claim_after = 2 * heartbeat_interval_s
        self._run_gap = 2 * heartbeat_interval_s
        self._took_over = False
        """Whether this worker subscribed again to take over: its first fresh heartbeat
        then suffices (the leader was unreachable; pulsar-lite may deliver only a trickle
        to the new consumer at first)."""
        self._on_leadership = on_leadership
        self._on_members_changed = on_members_changed
        self._report = report
        self._seal = seal or RecordSeal(None)
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()
        self._last_fresh = 0.0
        self._fresh_since: float | None = None
        """When the current run of fresh heartbeats began (None: none arrives)."""
        self._leader = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._known_leader = known_leader
        self._known_workers = known_workers
        self._consumer_name = f"{time.time_ns():020d}-{me.worker_id}"
        """Workers' first names sort by start time: the longest-running worker leads."""
        self._next_probe = 0.0
        self._leader_unreachable_since: float | None = None
        self._takeover_after = 0.0
        self.resubscriptions = 0
        """How often the leader was unreachable and this worker subscribed again."""
        # one client for the probes: a new one each probe costs tens of milliseconds of CPU
        self._http = httpx.Client(timeout=1.0, limits=httpx.Limits(keepalive_expiry=2.0))

    def start(self) -> None:
        self._producer = self._client.create_producer(self._topic, batching_enabled=False)
        self._consumer = self._subscribe()
        for target, name in ((self._beat, "heartbeat"), (self._listen, "membership")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        for resource in (self._consumer, self._producer):
            try:
                resource.close()
            except Exception as error:
                log.debug("closing a membership resource failed: %s", error)
        self._http.close()

    @property
    def is_leader(self) -> bool:
        return self._leader

    def members(self) -> list[WorkerInfo]:
        """Live workers (known to the leader only), sorted by id."""
        with self._lock:
            return sorted((m.info for m in self._members.values()), key=lambda w: w.worker_id)

    def reports(self) -> dict[str, WorkerReport]:
        """The latest report of each live worker heard from (known to the leader only)."""
        with self._lock:
            return {
                worker_id: member.report
                for worker_id, member in self._members.items()
                if member.report is not None
            }

    def _subscribe(self) -> Any:
        """Subscribe to the coordination topic (again) as ``self._consumer_name``."""
        return subscribe(
            self._client,
            self._topic,
            _SUBSCRIPTION,
            consumer_type=pulsar.ConsumerType.Failover,
            consumer_name=self._consumer_name,
            receiver_queue_size=100,
        )

    # --- threads ------------------------------------------------------------------------

    def _beat(self) -> None:
        payload = {"workerId": self.me.worker_id, "adminUrl": self.me.admin_url}
        while not self._stop.is_set():
            try:
                report = self._report()
            except Exception:  # a heartbeat must go out all the same: the worker is alive
                log.exception("reporting this worker's instances failed")
                report = WorkerReport(None)
            try:
                body = json.dumps(
                    {
                        **payload,
                        "sentAt": time.time(),
                        "assignment": report.assignment,
                        "starting": sorted(report.starting),
                    }
                ).encode()
                sealed = self._seal.seal(_HEARTBEAT, body, {})
                self._producer.send_async(body, _ignore, properties=sealed)
            except Exception as error:
                log.warning("sending a heartbeat failed: %s", error)
            self._stop.wait(self._interval)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._consumer.receive(int(self._interval * 1000))
            except pulsar.Timeout:
                message = None
            except Exception as error:
                if self._stop.is_set():
                    return
                log.warning("receiving heartbeats failed: %s", error)
                self._stop.wait(self._interval)
                message = None
            if message is not None:
                self._consumer.acknowledge(message)
                self._record(message)
            self._update()
            if self._leader:
                self._leader_unreachable_since = None  # a later wait starts afresh
            elif message is None:
                # Probing a paused leader blocks for a second: only when nothing is waiting, or
                # the heartbeats a new active consumer is handed would go stale first.
                self._watch_leader()

    def _record(self, message: Any) -> None:
        if not self._seal.accepts(_HEARTBEAT, self._topic, message):
            return  # a forged heartbeat proves nothing, not even that the leader is heard
        try:
            beat = json.loads(message.data())
            info = WorkerInfo(beat["workerId"], beat["adminUrl"])
            sent_at = float(beat["sentAt"])
            report = _report_of(beat)
        except (ValueError, KeyError, TypeError, IndexError):
            log.warning("ignoring a malformed heartbeat: %r", message.data()[:200])
            return
        now = time.time()
        if now - sent_at > self._leadership_timeout:
            return
        fresh_at = time.monotonic()
        if self._fresh_since is None or fresh_at - self._last_fresh > self._run_gap:
            self._fresh_since = fresh_at
        self._last_fresh = fresh_at
        with self._lock:
            known = self._members.get(info.worker_id)
            self._members[info.worker_id] = _Member(info, now, report)
        if known is None or known.info != info:
            log.info("worker %s (%s) is alive", info.worker_id, info.admin_url)
        if known is None or known.info != info or known.report != report:
            self._on_members_changed()

    def _update(self) -> None:
        now = time.monotonic()
        receiving = now - self._last_fresh < self._leadership_timeout
        if not receiving:
            self._fresh_since = None
        leader = receiving and (
            self._leader
            or self._took_over
            or (
                self._fresh_since is not None
                and self._last_fresh - self._fresh_since >= self._claim_after
            )
        )
        if leader != self._leader:
            self._leader = leader
            log.info("%s %s leader", self.me.worker_id, "became" if leader else "is no longer")
            if leader:
                self._took_over = False
                self._presume_known_workers_alive()
            else:
                with self._lock:
                    self._members.clear()
            self._on_leadership(leader)
            return
        wall = time.time()
        with self._lock:
            dead = [
                worker_id
                for worker_id, member in self._members.items()
                if wall - member.seen > self._liveness
            ]
            for worker_id in dead:
                del self._members[worker_id]
        for worker_id in dead:
            log.warning(
                "worker %s missed its heartbeats for %.1fs; removed", worker_id, self._liveness
            )
        if dead:
            self._on_members_changed()

    def _answers(self, worker: WorkerInfo) -> bool:
        """Whether the worker's HTTP server answers at all (any status will do)."""
        try:
            self._http.get(f"{worker.admin_url}/admin/v2/worker/cluster/leader/ready")
        except httpx.HTTPError:
            return False
        return True

    def _presume_known_workers_alive(self) -> None:
        """A new leader counts the workers of the assignment in force as members until they
        miss their heartbeats for the liveness timeout, but for the previous leader."""
        previous = self._known_leader()
        now = time.time()
        with self._lock:
            presumed = [
                info
                for info in self._known_workers()
                if info.worker_id not in self._members
                and (previous is None or info.worker_id != previous.worker_id)
            ]
            for info in presumed:
                self._members[info.worker_id] = _Member(info, now, None)
        if presumed:
            log.info(
                "presuming %s alive until heard from (for up to %.1fs)",
                ", ".join(sorted(info.worker_id for info in presumed)),
                self._liveness,
            )

    def _watch_leader(self) -> None:
        """Take over once the known leader has been unreachable for long enough, or, being
        the known leader, once no heartbeats have reached this worker for as long (see the
        module doc)."""
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + self._interval
        leader = self._known_leader()
        itself = leader is not None and leader.worker_id == self.me.worker_id
        if leader is None or (not itself and self._answers(leader)):
            self._leader_unreachable_since = None
            return
        if self._leader_unreachable_since is None:
            self._leader_unreachable_since = now
            others = sorted(
                w.worker_id for w in self._known_workers() if w.worker_id != leader.worker_id
            )
            rank = others.index(self.me.worker_id) if self.me.worker_id in others else len(others)
            self._takeover_after = self._liveness * (2 + (0 if itself else rank))
        waited = now - self._leader_unreachable_since
        if waited < self._takeover_after:
            return
        if itself:
            log.warning(
                "no heartbeats reached this worker, the leader, for %.1fs: taking over", waited
            )
        else:
            log.warning(
                "leader %s has not answered for %.1fs and no worker took over: taking over",
                leader.worker_id,
                waited,
            )
        self._leader_unreachable_since = None
        self.resubscriptions += 1
        self._took_over = True
        self._consumer_name = f"!{newest_first()}-{self.me.worker_id}"
        try:
            self._consumer.close()
            self._consumer = self._subscribe()
        except Exception as error:
            log.warning("subscribing again to the coordination topic failed: %s", error)


@dataclass(frozen=True)
class _Member:
    """A worker as the leader knows it."""

    info: WorkerInfo
    seen: float
    """When its last heartbeat arrived (or since when it is presumed alive), wall clock."""
    report: WorkerReport | None
    """Its latest report; None while presumed alive and not heard from."""


def _report_of(beat: dict[str, Any]) -> WorkerReport:
    """The report in a heartbeat (a worker of an older version sends none)."""
    applied = beat.get("assignment")
    assignment = None if applied is None else (int(applied[0]), int(applied[1]))
    return WorkerReport(assignment, frozenset(str(key) for key in beat.get("starting", ())))


def _ignore(result: Any, message_id: Any) -> None:
    """Heartbeats are fire-and-forget: the next one follows shortly."""
