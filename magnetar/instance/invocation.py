"""Calling the user's Python function once per window: with its context or not, within its
``timeoutMs``, timing every call for the instance's latency metrics. An ``async def process``
is awaited then and there (windows are called one at a time).

The timeout is enforced with SIGALRM when the instance runs on the main thread (its own
process, as in localrun and the worker's process runtime).
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from magnetar.instance.config import LONGEST_TIME_LIMIT_S
from magnetar.instance.context import InstanceContext
from magnetar.instance.exceptions import InvocationTimeoutError
from magnetar.instance.loader import LoadedFunction
from magnetar.instance.metrics import InstanceMetrics

__all__ = ["Invoker"]

_NEVER_AWAITABLE = frozenset({str, bytes, int, float, bool, dict, list, tuple, type(None)})
"""What functions return most: told apart by type alone, where ``inspect.isawaitable``'s
abstract-class check cost 3% of a simple function's message."""


class Invoker:
    """Calls the function; the caller handles what it returns or raises."""

    def __init__(
        self,
        function: LoadedFunction,
        context: InstanceContext,
        metrics: InstanceMetrics,
        timeout_ms: int | None,
    ) -> None:
        self._process = function.process
        self._takes_context = function.takes_context
        self.context = context
        """The context the function is called with."""
        self._metrics = metrics
        self._timeout_ms = timeout_ms
        self._alarm_s = 0.0
        self._in_invocation = False

    @contextmanager
    def timeouts(self) -> Iterator[None]:
        """Enforce ``timeoutMs`` while this context is open (only on the main thread)."""
        timeout_s = (self._timeout_ms or 0) / 1000
        if timeout_s <= 0 or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self._alarm_s = min(timeout_s, LONGEST_TIME_LIMIT_S)
        try:
            yield
        finally:
            self._alarm_s = 0.0
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def call(self, value: Any) -> Any:
        """``process(value[, context])``: what it returns; raises what it raises, or
        ``InvocationTimeoutError``."""
        metrics = self._metrics
        started = time.perf_counter()
        try:
            if self._alarm_s:
                self._in_invocation = True
                signal.setitimer(signal.ITIMER_REAL, self._alarm_s)
            if self._takes_context:
                result = self._process(value, self.context)
            else:
                result = self._process(value)
            if type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
            return result
        finally:
            if self._alarm_s:
                self._in_invocation = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            elapsed = time.perf_counter() - started
            metrics.latency_total_s += elapsed
            metrics.latency_count += 1
            metrics.latencies_s.append(elapsed)
            metrics.last_invocation_ms = int(time.time() * 1000)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._in_invocation:
            self._in_invocation = False
            raise InvocationTimeoutError(
                f"the function ran longer than its timeout of {self._timeout_ms} ms"
            )


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
