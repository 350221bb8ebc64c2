"""The runtime manager: runs this worker's share of the function instances and keeps them alive.

``apply(desired)`` only records what should run and wakes the supervisor thread, so the
assignment listener never waits for an instance to start or drain. The supervisor, every
``liveness_interval_s`` (sooner when a restart is due or an instance is stopping):

* reaps instances that were asked to stop, killing those that overstay ``stop_timeout_s``;
* finds instances that died without being asked to and schedules their restart with
  exponential backoff, counting restarts per instance key;
* starts instances that are due. A replacement (new version or config) starts only once its
  predecessor has exited, so two generations of one instance never process side by side
  (that would break ordering on Failover subscriptions and EFFECTIVELY_ONCE sequence ids).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from magnetar.instance.crashes import blame
from magnetar.instance.metrics import ExceptionInfo, MetricsSnapshot
from magnetar.worker.model import parse_instance_key
from magnetar.worker.runtime import InstanceSpec, Runtime, RuntimeHandle

__all__ = ["BackoffPolicy", "RuntimeManager"]

log = logging.getLogger(__name__)

_LATEST_EXCEPTIONS = 10
_RETIRE_POLL_S = 0.02
"""How often instances being stopped are checked: a replacement may be waiting for them."""
_KILL_WAIT_S = 2.0
_DRAINING = "stopping: finishing its in-flight messages"


@dataclass(frozen=True)
class BackoffPolicy:
    """How long to wait before restarting an instance that keeps crashing."""

    initial_s: float = 0.5
    """Delay before restarting after a first crash."""
    max_s: float = 30.0
    """Longest delay between two restarts."""
    multiplier: float = 2.0
    """Each further crash in a row multiplies the delay by this."""
    reset_after_s: float = 60.0
    """An instance that runs this long without crashing starts over from ``initial_s``."""

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < self.initial_s or self.multiplier < 1:
            raise ValueError(
                "restart backoff needs 0 <= initial_s <= max_s and multiplier >= 1, got "
                f"initial_s={self.initial_s}, max_s={self.max_s}, multiplier={self.multiplier}"
            )

    def delay(self, crashes: int) -> float:
        """The delay before the restart that follows the ``crashes``-th crash in a row."""
        return min(self.max_s, self.initial_s * self.multiplier ** max(0, crashes - 1))


@dataclass(eq=False)
class _Instance:
    """One desired instance and what the manager knows about its runs."""

    spec: InstanceSpec
    start_at: float
    """When to (re)start it, while it has no handle."""
    handle: RuntimeHandle | None = None
    started_at: float = 0.0
    failures: int = 0
    """Crashes in a row (for the backoff); reset once it has run fine for a while."""
    num_restarts: int = 0
    restart_requested: bool = False
    """A restart was asked for: counted once its new run starts, so ``numRestarts`` never
    counts a run that has not begun (the old one may still be draining)."""
    num_crashes: int = 0
    crashes: deque[ExceptionInfo] = field(default_factory=lambda: deque(maxlen=_LATEST_EXCEPTIONS))
    last_snapshot: MetricsSnapshot | None = None
    """The last report of the run that crashed, shown until the next run reports."""
    earlier_crashes: dict[str, int] = field(default_factory=dict)
    """Messages runs died with (``message_key`` -> deaths, see ``crashes``), for the next run
    to fail them or to run them alone."""


@dataclass(eq=False)
class _Retired:
    """An instance asked to stop, watched until it has exited."""

    key: str
    handle: RuntimeHandle
    reason: str
    kill_at: float
    asked_at: float


class RuntimeManager:
    """Makes the instances running on this worker match the assignment, and supervises them."""

    def __init__(
        self,
        runtime: Runtime,
        worker_id: str,
        restart_backoff: BackoffPolicy | None = None,
        liveness_interval_s: float = 0.5,
        stop_timeout_s: float = 10.0,
        busy_warning_s: float = 5.0,
    ) -> None:
        """``stop_timeout_s``: how long a retired instance may drain before it is killed;
        ``busy_warning_s``: from how long in user code on one message the status says so."""
        self.runtime = runtime
        self.worker_id = worker_id
        self.restart_backoff = restart_backoff or BackoffPolicy()
        self.liveness_interval_s = liveness_interval_s
        self.stop_timeout_s = stop_timeout_s
        self.busy_warning_s = busy_warning_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._instances: dict[str, _Instance] = {}
        self._retired: list[_Retired] = []
        self._closing = False
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> RuntimeManager:
        """Start the supervisor thread; instances given to ``apply`` run from then on."""
        if self._thread is None:
            self.runtime.prepare()
            self._thread = threading.Thread(
                target=self._supervise, name="runtime-manager", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop every instance (``drain``: finish in-flight messages, for at most
        ``timeout_s``, by default ``stop_timeout_s``; then it is killed), then the supervisor.
        Instances still stopping from before are killed by then too."""
        with self._lock:
            if not self._closing:
                log.info("stopping all %d instances: the worker is stopping", len(self._instances))
            self._closing = True
            now = time.monotonic()
            kill_at = now + (self.stop_timeout_s if timeout_s is None else timeout_s)
            for slot in self._instances.values():
                self._retire(slot, "the worker is stopping", now, drain, kill_at)
            for retired in self._retired:
                retired.kill_at = min(retired.kill_at, kill_at)
            self._instances.clear()
        self._wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until ``stop()`` has finished (every instance exited); False on timeout."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- what should run ------------------------------------------------------------------

    def apply(self, desired: Mapping[str, InstanceSpec]) -> None:
        """Make the running set equal ``desired`` (instance key -> spec); returns at once."""
        for key, spec in desired.items():
            if key != spec.key:
                raise ValueError(f"instance key {key!r} does not match its spec ({spec.key!r})")
        with self._lock:
            if self._closing:
                log.debug("ignoring an assignment: the runtime manager is stopping")
                return
            now = time.monotonic()
            for key in self._instances.keys() - desired.keys():
                self._retire(self._instances.pop(key), "no longer assigned to this worker", now)
            for key, spec in desired.items():
                slot = self._instances.get(key)
                if slot is None:
                    log.info("starting instance %s (version %d): assigned", key, spec.version)
                    self._instances[key] = _Instance(spec, start_at=now)
                elif slot.spec != spec:
                    reason = (
                        f"version {slot.spec.version} -> {spec.version}"
                        if slot.spec.version != spec.version
                        else "its config changed"
                    )
                    log.info("restarting instance %s: %s", key, reason)
                    self._retire(slot, reason, now)
                    # a new version may fix the crash: the backoff starts over, the count stays
                    self._instances[key] = _Instance(
                        spec,
                        start_at=now,
                        num_restarts=slot.num_restarts,
                        num_crashes=slot.num_crashes,
                        crashes=slot.crashes,
                    )
        self._wake.set()

    def restart(self, key: str) -> bool:
        """Restart an instance assigned here (gracefully: it drains first); False if it is
        not assigned here. The new run starts once the old one has exited."""
        with self._lock:
            slot = self._instances.get(key)
            if slot is None or self._closing:
                return False
            now = time.monotonic()
            self._retire(slot, "restart requested", now)
            self._instances[key] = _Instance(
                slot.spec,
                start_at=now,
                num_restarts=slot.num_restarts,
                restart_requested=True,
                num_crashes=slot.num_crashes,
                crashes=slot.crashes,
                earlier_crashes=slot.earlier_crashes,
            )
        self._wake.set()
        return True

    # --- what is running ------------------------------------------------------------------

    def status(self, key: str) -> MetricsSnapshot | None:
        """The status of an instance assigned here, or of one that is no longer wanted here
        but still drains, subscribed (it may still take a message); None if neither."""
        with self._lock:
            slot = self._instances.get(key)
            if slot is not None:
                return self._status(slot)
            handle = self._draining(key)
        if handle is None or not handle.is_alive():
            return None
        snapshot = handle.snapshot() or _empty_snapshot(parse_instance_key(key)[1])
        if not snapshot.running:  # its consumers are closed: it takes nothing more
            return None
        return replace(snapshot, error=_DRAINING, worker_id=self.worker_id)

    def _draining(self, key: str) -> RuntimeHandle | None:
        """The handle of a retired run of ``key`` that has not exited yet."""
        return next((r.handle for r in self._retired if r.key == key), None)

    def statuses(self) -> dict[str, MetricsSnapshot]:
        """The status of every instance assigned here, by instance key."""
        with self._lock:
            return {key: self._status(slot) for key, slot in self._instances.items()}

    def running_keys(self) -> set[str]:
        """The instances assigned here that run right now: alive, and subscribed to their
        inputs (as their status says)."""
        with self._lock:
            handles = {key: slot.handle for key, slot in self._instances.items()}
        running = set()
        for key, handle in handles.items():
            snapshot = handle.snapshot() if handle is not None else None
            if snapshot is not None and snapshot.running:
                running.add(key)
        return running

    def pid(self, key: str) -> int | None:
        """The OS process running an instance; None if not running or on a thread."""
        with self._lock:
            slot = self._instances.get(key)
            return None if slot is None or slot.handle is None else slot.handle.pid

    def _status(self, slot: _Instance) -> MetricsSnapshot:
        handle = slot.handle
        if handle is None:
            # a stopping instance runs until it has drained: it may still take a message
            handle = self._draining(slot.spec.key)
        snapshot = handle.snapshot() if handle is not None else slot.last_snapshot
        if snapshot is None:
            snapshot = _empty_snapshot(slot.spec.instance_id)
        # running once the instance says so (its consumers are subscribed), not merely once
        # its process is alive: a message published before that may be missed (Latest)
        running = handle is not None and handle.is_alive() and snapshot.running
        error = snapshot.error
        if not error and not running and slot.failures:
            error = slot.crashes[-1].exception_string
        if not error and running and handle is not None:
            error = self._busy(handle)
        # the crashes (which the instance cannot report itself) join its system exceptions
        exceptions = sorted(
            [*snapshot.latest_system_exceptions, *slot.crashes], key=lambda e: e.timestamp_ms
        )
        return replace(
            snapshot,
            running=running,
            error=error,
            num_restarts=slot.num_restarts,
            worker_id=self.worker_id,
            system_exceptions=snapshot.system_exceptions + slot.num_crashes,
            latest_system_exceptions=exceptions[-_LATEST_EXCEPTIONS:],
        )

    def _busy(self, handle: RuntimeHandle) -> str:
        """What the status says of a message user code has had too long ('' if none): the
        instance cannot report it itself, its only thread being in user code."""
        in_flight = handle.in_flight()
        if not in_flight:
            return ""
        oldest = in_flight[0]
        busy_s = time.time() - oldest.entered_at
        if busy_s < self.busy_warning_s:
            return ""
        return f"{oldest.description} in user code for {busy_s:.0f} s"

    # --- the supervisor -------------------------------------------------------------------

    def _supervise(self) -> None:
        log.info("runtime manager of worker %s started", self.worker_id)
        while True:
            self._wake.clear()
            failed = False
            try:
                self._reap_retired()
                self._check_liveness()
                self._start_due()
            except Exception:
                # a misbehaving runtime must not end the supervision of every other instance
                log.exception("runtime manager: supervising the instances failed; retrying")
                failed = True
            with self._lock:
                if self._closing and not self._retired:
                    break
                timeout = self.liveness_interval_s if failed else self._next_wakeup()
            self._wake.wait(timeout)
        self.runtime.close()
        log.info("runtime manager of worker %s stopped", self.worker_id)

    def _next_wakeup(self) -> float:
        timeout = self.liveness_interval_s
        if self._retired:
            timeout = min(timeout, _RETIRE_POLL_S)
        now = time.monotonic()
        stopping = {retired.key for retired in self._retired}
        for key, slot in self._instances.items():
            if slot.handle is None and key not in stopping:
                timeout = min(timeout, slot.start_at - now)
        return max(0.0, timeout)

    def _retire(
        self,
        slot: _Instance,
        reason: str,
        now: float,
        drain: bool = True,
        kill_at: float | None = None,
    ) -> None:
        """Ask a slot's instance to stop; the supervisor watches it until it has exited, and
        kills it at ``kill_at`` (by default ``stop_timeout_s`` from now)."""
        handle = slot.handle
        slot.handle = None
        if handle is None:
            return
        log.info("stopping instance %s (%s): %s", slot.spec.key, _where(handle), reason)
        handle.stop(drain)
        if kill_at is None:
            kill_at = now + self.stop_timeout_s
        self._retired.append(_Retired(slot.spec.key, handle, reason, kill_at, now))

    def _reap_retired(self) -> None:
        with self._lock:
            retired = list(self._retired)
        done: list[_Retired] = []
        for entry in retired:
            if not entry.handle.is_alive():
                log.info("instance %s stopped (%s)", entry.key, entry.reason)
                done.append(entry)
            elif time.monotonic() >= entry.kill_at:
                log.warning(
                    "instance %s (%s) did not stop within %.0f s; killing it",
                    entry.key,
                    _where(entry.handle),
                    entry.kill_at - entry.asked_at,
                )
                entry.handle.kill()
                entry.handle.wait(_KILL_WAIT_S)
                done.append(entry)
        if done:
            with self._lock:
                self._retired = [entry for entry in self._retired if entry not in done]

    def _check_liveness(self) -> None:
        backoff = self.restart_backoff
        with self._lock:
            now = time.monotonic()
            for key, slot in self._instances.items():
                handle = slot.handle
                if handle is None:
                    continue
                if handle.is_alive():
                    handle.enforce_limits()
                    if slot.failures and now - slot.started_at >= backoff.reset_after_s:
                        log.info("instance %s has run fine since its restart", key)
                        slot.failures = 0
                        # what it died on was dead-lettered or went through since
                        slot.earlier_crashes.clear()
                    continue
                slot.last_snapshot = handle.snapshot()
                slot.handle = None
                error = handle.exit_error() or "the instance exited without being asked to"
                error += blame(slot.earlier_crashes, handle.in_flight())
                self._crashed(slot, error, now, _where(handle))

    def _crashed(self, slot: _Instance, error: str, now: float, where: str = "") -> None:
        slot.failures += 1
        slot.num_crashes += 1
        slot.crashes.append(ExceptionInfo(error, int(time.time() * 1000)))
        delay = self.restart_backoff.delay(slot.failures)
        slot.start_at = now + delay
        log.warning(
            "instance %s%s crashed (%d in a row): %s; restarting it in %.1f s",
            slot.spec.key,
            f" ({where})" if where else "",
            slot.failures,
            error,
            delay,
        )

    def _start_due(self) -> None:
        with self._lock:
            if self._closing:
                return
            now = time.monotonic()
            stopping = {retired.key for retired in self._retired}
            due = [
                slot
                for key, slot in self._instances.items()
                if slot.handle is None and slot.start_at <= now and key not in stopping
            ]
        for slot in due:
            self._start(slot)

    def _start(self, slot: _Instance) -> None:
        """Start a slot's instance outside the lock (a thread instance waits to subscribe)."""
        key = slot.spec.key
        handle: RuntimeHandle | None = None
        start_error = ""
        try:
            handle = self.runtime.start(
                replace(slot.spec, earlier_crashes=dict(slot.earlier_crashes))
            )
        except Exception as error:
            log.exception("starting instance %s failed", key)
            start_error = f"cannot start the instance: {type(error).__name__}: {error}"
        with self._lock:
            now = time.monotonic()
            if self._closing or self._instances.get(key) is not slot:
                # unassigned or replaced while it was starting
                if handle is not None:
                    slot.handle = handle
                    self._retire(slot, "no longer assigned to this worker", now)
                return
            restart = ""
            if slot.failures or slot.restart_requested:
                slot.num_restarts += 1
                slot.restart_requested = False
                restart = f", restart {slot.num_restarts}"
            if handle is None:
                self._crashed(slot, start_error, now)
                return
            slot.handle = handle
            slot.started_at = now
            log.info("instance %s is running (%s%s)", key, _where(handle), restart)


def _where(handle: RuntimeHandle) -> str:
    return "thread" if handle.pid is None else f"pid {handle.pid}"


def _empty_snapshot(instance_id: int) -> MetricsSnapshot:
    """The status of an instance that has not reported yet."""
    return MetricsSnapshot(
        instance_id=instance_id,
        running=False,
        error="",
        received=0,
        processed=0,
        user_exceptions=0,
        system_exceptions=0,
        latest_user_exceptions=[],
        latest_system_exceptions=[],
        average_latency_ms=0.0,
        p99_latency_ms=0.0,
        last_invocation_ms=0,
        user_metrics={},
    )
