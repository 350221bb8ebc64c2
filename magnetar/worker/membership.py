"""Membership and leader election on the coordination topic.

Every worker publishes a heartbeat (its id and admin URL) every ``heartbeat_interval`` and
consumes the topic through one Failover subscription. The broker delivers to exactly one
consumer, so receiving fresh heartbeats means being the leader, and the heartbeats tell the
leader who is alive. Heartbeats carry their send time: old ones (a backlog handed to a new
leader, or prefetched by a worker that was paused) prove nothing and are dropped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar

from magnetar.client import subscribe
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

    def start(self) -> None:
        self._producer = self._client.create_producer(self._topic, batching_enabled=False)
        self._consumer = subscribe(
            self._client,
            self._topic,
            _SUBSCRIPTION,
            consumer_type=pulsar.ConsumerType.Failover,
            # The broker makes the lowest name active: prefixing the start time keeps the
            # longest-running worker leader, so a restarted one does not take leadership back.
            consumer_name=f"{time.time_ns():020d}-{self.me.worker_id}",
            receiver_queue_size=100,
        )
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


def _ignore(result: Any, message_id: Any) -> None:
    """Heartbeats are fire-and-forget: the next one follows shortly."""
