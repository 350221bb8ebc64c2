"""Per-instance counters and their Pulsar-shaped views (FunctionStatus, FunctionStats).

Updated only by the instance's processing thread, so plain attributes: no locks on the
hot path. Readers on other threads see a consistent-enough snapshot through ``snapshot()``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "USER_METRIC_PREFIX",
    "ExceptionInfo",
    "InstanceMetrics",
    "MetricsSnapshot",
    "WindowCounts",
]

_LATEST_EXCEPTIONS = 10
_LATENCY_WINDOW = 4096
_WINDOW_S = 60.0
_WINDOW_STEP_S = 1.0


@dataclass(frozen=True)
class ExceptionInfo:
    """One recent exception, as Pulsar's ``ExceptionInformation``."""

    exception_string: str
    timestamp_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"exceptionString": self.exception_string, "timestampMs": self.timestamp_ms}


@dataclass(frozen=True)
class WindowCounts:
    """Counts over the last minute (Pulsar's ``1min`` stats)."""

    received: int = 0
    processed: int = 0
    user_exceptions: int = 0
    system_exceptions: int = 0
    average_latency_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "receivedTotal": self.received,
            "processedSuccessfullyTotal": self.processed,
            "systemExceptionsTotal": self.system_exceptions,
            "userExceptionsTotal": self.user_exceptions,
            "avgProcessLatency": self.average_latency_ms,
        }


@dataclass(frozen=True)
class MetricsSnapshot:
    """A point-in-time copy of an instance's metrics (picklable, sent between processes)."""

    instance_id: int
    running: bool
    error: str
    received: int
    processed: int
    user_exceptions: int
    system_exceptions: int
    latest_user_exceptions: list[ExceptionInfo]
    latest_system_exceptions: list[ExceptionInfo]
    average_latency_ms: float
    p99_latency_ms: float
    last_invocation_ms: int
    user_metrics: dict[str, tuple[float, int]]
    """``context.record_metric`` values: name -> (sum, count)."""
    num_restarts: int = 0
    worker_id: str = ""
    last_minute: WindowCounts = field(default_factory=WindowCounts)
    dead_lettered: int = 0
    """Messages sent to the dead-letter topic after their retries were used up."""
    timers_fired: int = 0
    timers_pending: int = 0
    """The function's pending timers (reported by instance 0 only, so sums add up)."""
    timer_lateness_p50_ms: float = 0.0
    timer_lateness_p99_ms: float = 0.0
    """How late the recent firings were, after their due time."""

    def status(self) -> dict[str, Any]:
        """The instance part of Pulsar's FunctionStatus."""
        return {
            "instanceId": self.instance_id,
            "status": {
                "running": self.running,
                "error": self.error,
                "numRestarts": self.num_restarts,
                "numReceived": self.received,
                "numSuccessfullyProcessed": self.processed,
                "numUserExceptions": self.user_exceptions,
                "latestUserExceptions": [e.to_json() for e in self.latest_user_exceptions],
                "numSystemExceptions": self.system_exceptions,
                "latestSystemExceptions": [e.to_json() for e in self.latest_system_exceptions],
                "averageLatency": self.average_latency_ms,
                "lastInvocationTime": self.last_invocation_ms,
                "workerId": self.worker_id,
                "numDeadLettered": self.dead_lettered,
                "numTimersFired": self.timers_fired,
                "numTimersPending": self.timers_pending,
                "timerLatenessP99Ms": self.timer_lateness_p99_ms,
            },
        }

    def stats(self) -> dict[str, Any]:
        """The instance part of Pulsar's FunctionStats."""
        return {
            "instanceId": self.instance_id,
            "metrics": {
                "receivedTotal": self.received,
                "processedSuccessfullyTotal": self.processed,
                "systemExceptionsTotal": self.system_exceptions,
                "userExceptionsTotal": self.user_exceptions,
                "avgProcessLatency": self.average_latency_ms,
                "p99ProcessLatency": self.p99_latency_ms,
                "1min": self.last_minute.to_json(),
                "lastInvocation": self.last_invocation_ms,
                "deadLetteredTotal": self.dead_lettered,
                "timersFiredTotal": self.timers_fired,
                "timersPending": self.timers_pending,
                "timerLatenessP50Ms": self.timer_lateness_p50_ms,
                "timerLatenessP99Ms": self.timer_lateness_p99_ms,
                "userMetrics": self.user_metrics_json(),
            },
        }

    def user_metrics_json(self) -> dict[str, float]:
        """The user metrics as Apache Pulsar's instances report them in stats:
        ``user_metric_<name>_sum`` and ``user_metric_<name>_count`` (a double there too)."""
        named: dict[str, float] = {}
        for name, (total, count) in sorted(self.user_metrics.items()):
            named[f"{USER_METRIC_PREFIX}{name}_sum"] = total
            named[f"{USER_METRIC_PREFIX}{name}_count"] = float(count)
        return named


USER_METRIC_PREFIX = "user_metric_"
"""Apache Pulsar's prefix of a user metric's name in stats and Prometheus."""


@dataclass
class InstanceMetrics:
    """Live counters of one instance."""

    instance_id: int
    received: int = 0
    processed: int = 0
    user_exceptions: int = 0
    system_exceptions: int = 0
    dead_lettered: int = 0
    timers_fired: int = 0
    timers_pending: int = 0
    timer_lateness_ms: deque[int] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))
    latency_total_s: float = 0.0
    latency_count: int = 0
    last_invocation_ms: int = 0
    latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))
    latest_user_exceptions: deque[ExceptionInfo] = field(
        default_factory=lambda: deque(maxlen=_LATEST_EXCEPTIONS)
    )
    latest_system_exceptions: deque[ExceptionInfo] = field(
        default_factory=lambda: deque(maxlen=_LATEST_EXCEPTIONS)
    )
    user_metric_sums: dict[str, float] = field(default_factory=dict)
    user_metric_counts: dict[str, int] = field(default_factory=dict)
    error: str = ""
    _marks: deque[tuple[float, int, int, int, int, float, int]] = field(
        default_factory=lambda: deque(maxlen=int(_WINDOW_S / _WINDOW_STEP_S) + 2)
    )
    """(time, counters...) about once a second, for the last minute's counts."""

    def record_user_exception(self, error: BaseException | str) -> None:
        self.user_exceptions += 1
        self.latest_user_exceptions.append(_info(error))

    def record_system_exception(self, error: BaseException | str) -> None:
        self.system_exceptions += 1
        self.latest_system_exceptions.append(_info(error))

    def record_user_metric(self, name: str, value: float) -> None:
        self.user_metric_sums[name] = self.user_metric_sums.get(name, 0.0) + value
        self.user_metric_counts[name] = self.user_metric_counts.get(name, 0) + 1

    def snapshot(self, running: bool) -> MetricsSnapshot:
        latencies = sorted(self.latencies_s)
        p99 = latencies[max(0, math.ceil(len(latencies) * 0.99) - 1)] if latencies else 0.0
        average = self.latency_total_s / self.latency_count if self.latency_count else 0.0
        return MetricsSnapshot(
            instance_id=self.instance_id,
            running=running,
            error=self.error,
            received=self.received,
            processed=self.processed,
            user_exceptions=self.user_exceptions,
            system_exceptions=self.system_exceptions,
            latest_user_exceptions=list(self.latest_user_exceptions),
            latest_system_exceptions=list(self.latest_system_exceptions),
            average_latency_ms=average * 1000,
            p99_latency_ms=p99 * 1000,
            last_invocation_ms=self.last_invocation_ms,
            user_metrics={
                name: (total, self.user_metric_counts[name])
                for name, total in self.user_metric_sums.items()
            },
            last_minute=self._last_minute(),
            dead_lettered=self.dead_lettered,
            timers_fired=self.timers_fired,
            timers_pending=self.timers_pending,
            timer_lateness_p50_ms=float(_percentile(self.timer_lateness_ms, 0.5)),
            timer_lateness_p99_ms=float(_percentile(self.timer_lateness_ms, 0.99)),
        )

    def _last_minute(self) -> WindowCounts:
        now = time.monotonic()
        mark = (
            now,
            self.received,
            self.processed,
            self.user_exceptions,
            self.system_exceptions,
            self.latency_total_s,
            self.latency_count,
        )
        marks = self._marks
        if not marks or now - marks[-1][0] >= _WINDOW_STEP_S:
            marks.append(mark)
        while len(marks) > 1 and now - marks[0][0] > _WINDOW_S:
            marks.popleft()
        first = marks[0]
        latency_count = mark[6] - first[6]
        latency_s = (mark[5] - first[5]) / latency_count if latency_count else 0.0
        return WindowCounts(
            received=mark[1] - first[1],
            processed=mark[2] - first[2],
            user_exceptions=mark[3] - first[3],
            system_exceptions=mark[4] - first[4],
            average_latency_ms=latency_s * 1000,
        )


def _percentile(values: deque[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * fraction) - 1)] if ordered else 0


def _info(error: BaseException | str) -> ExceptionInfo:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return ExceptionInfo(text, int(time.time() * 1000))
