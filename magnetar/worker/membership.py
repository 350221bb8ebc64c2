"""Membership and leader election on the coordination topic.

Every worker publishes a heartbeat (its id and admin URL) every ``heartbeat_interval`` and
consumes the topic through one Failover subscription. The broker delivers to exactly one
consumer, so receiving fresh heartbeats means being the leader, and the heartbeats tell the
leader who is alive. Heartbeats carry their send time: old ones (a backlog handed to a new
leader, or prefetched by a worker that was paused) prove nothing and are dropped.

pulsar-lite 0.2 never removes a consumer whose connection was reset (its process killed
while the broker wrote to it), and makes active the consumer whose name sorts first: a dead
leader's consumer could hold the subscription for good. So a worker that cannot reach the
leader it knows (from the assignments) for ``liveness_timeout`` times two (time for the
broker to drop a dead leader and for its successor to publish assignments) plus its rank
among the other workers the assignments list (so that they take over one at a time, each
seeing whether the one before succeeded), subscribes again under a *takeover* name, which
sorts before every worker's first name and, among takeovers, puts the newest first: it
becomes the leader.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pulsar

from magnetar.client import newest_first, subscribe
from magnetar.worker.model import WorkerInfo

__all__ = ["Membership"]

log = logging.getLogger(__name__)

_SUBSCRIPTION = "participants"


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
    ) -> None:
        self._client = client
        self._topic = topic
        self.me = me
        self._interval = heartbeat_interval_s
        self._liveness = liveness_timeout_s
        # Leadership is lost quickly (a few missed heartbeats) so two leaders overlap little.
        self._leadership_timeout = max(3 * heartbeat_interval_s, 1.0)
        self._on_leadership = on_leadership
        self._on_members_changed = on_members_changed
        self._members: dict[str, tuple[WorkerInfo, float]] = {}
        self._lock = threading.Lock()
        self._last_fresh = 0.0
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

    @property
    def is_leader(self) -> bool:
        return self._leader

    def members(self) -> list[WorkerInfo]:
        """Live workers (known to the leader only), sorted by id."""
        with self._lock:
            return sorted((info for info, _ in self._members.values()), key=lambda w: w.worker_id)

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
                body = json.dumps({**payload, "sentAt": time.time()}).encode()
                self._producer.send_async(body, _ignore)
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
            # Probing a paused leader blocks for a second: only when nothing is waiting, or
            # the heartbeats a new active consumer is handed would go stale before it reads them.
            if not self._leader and message is None:
                self._watch_leader()

    def _record(self, message: Any) -> None:
        try:
            beat = json.loads(message.data())
            info = WorkerInfo(beat["workerId"], beat["adminUrl"])
            sent_at = float(beat["sentAt"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed heartbeat: %r", message.data()[:200])
            return
        now = time.time()
        if now - sent_at > self._leadership_timeout:
            return
        self._last_fresh = time.monotonic()
        with self._lock:
            known = self._members.get(info.worker_id)
            self._members[info.worker_id] = (info, now)
        if known is None or known[0] != info:
            log.info("worker %s (%s) is alive", info.worker_id, info.admin_url)
            self._on_members_changed()

    def _update(self) -> None:
        leader = time.monotonic() - self._last_fresh < self._leadership_timeout
        if leader != self._leader:
            self._leader = leader
            log.info("%s %s leader", self.me.worker_id, "became" if leader else "is no longer")
            if not leader:
                with self._lock:
                    self._members.clear()
            self._on_leadership(leader)
            return
        now = time.time()
        with self._lock:
            dead = [wid for wid, (_, seen) in self._members.items() if now - seen > self._liveness]
            for worker_id in dead:
                del self._members[worker_id]
        for worker_id in dead:
            log.warning(
                "worker %s missed its heartbeats for %.1fs; removed", worker_id, self._liveness
            )
        if dead:
            self._on_members_changed()

    def _watch_leader(self) -> None:
        """Take over once the known leader has been unreachable for long enough (see the
        module doc)."""
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + self._interval
        leader = self._known_leader()
        if leader is None or leader.worker_id == self.me.worker_id or _answers(leader):
            self._leader_unreachable_since = None
            return
        if self._leader_unreachable_since is None:
            self._leader_unreachable_since = now
            others = sorted(
                w.worker_id for w in self._known_workers() if w.worker_id != leader.worker_id
            )
            rank = others.index(self.me.worker_id) if self.me.worker_id in others else len(others)
            self._takeover_after = self._liveness * (2 + rank)
        waited = now - self._leader_unreachable_since
        if waited < self._takeover_after:
            return
        log.warning(
            "leader %s has not answered for %.1fs and no worker took over: taking over",
            leader.worker_id,
            waited,
        )
        self._leader_unreachable_since = None
        self.resubscriptions += 1
        self._consumer_name = f"!{newest_first()}-{self.me.worker_id}"
        try:
            self._consumer.close()
            self._consumer = self._subscribe()
        except Exception as error:
            log.warning("subscribing again to the coordination topic failed: %s", error)


def _answers(worker: WorkerInfo) -> bool:
    """Whether the worker's HTTP server answers at all (any status will do)."""
    try:
        httpx.get(f"{worker.admin_url}/admin/v2/worker/cluster/leader/ready", timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def _ignore(result: Any, message_id: Any) -> None:
    """Heartbeats are fire-and-forget: the next one follows shortly."""
