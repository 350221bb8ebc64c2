"""Running a JavaScript function over a chunk of messages with one call into V8.

Crossing into V8 through mini-racer costs about half a millisecond, so a chunk goes in as one
JSON batch and its results come back as one JSON reply; a call is repeated only when V8 must
stop (see below), so the crossing is paid once per chunk, not per message.

What each input came to is a :class:`ScriptOutcome`, handed out one at a time by a
:class:`ScriptRun`: the instance handles an outcome completely (sends, acknowledgement,
failure, state commit or rollback) before it asks for the next, as it would after calling a
Python function. When an outcome is handed out its effects are applied: state writes through
the instance's ``StateStore`` (the instance then commits or rolls them back), log lines
through the function's logger, metrics. A message that throws or times out keeps only its
log lines: its publishes and state writes are dropped, so its redelivery applies them once.

Guarantees kept while batching:

* Time limit per message: each call gets the full ``timeoutMs``. When V8 stops a call, the
  message it was in is a timeout only if it was the call's first message (so it had the whole
  budget to itself); otherwise the batch resumes at that message with a fresh budget. No
  message is failed for the time others took.
* Heap limit: the message running when the heap hit its limit fails; the batch goes on after
  a garbage collection (the instance fails, and is restarted, if the script's globals keep the
  heap full).
* Ordered subscriptions (``stop_on_error``): the batch stops at the first failure, so the
  messages after it come again, in order, after the instance's rewind.
* State reads: see the prelude. A key the batch has not read yet is read from the store when
  the instance has handled every outcome before the message that wants it (so the read sees
  their writes); that message then runs again in V8, and only the run that completes has
  effects. A message may therefore run more than once, once per new key it reads.
* HTTP requests (``curl``, see ``_curl``) are fetched the same way, at the same point; their
  answers go with every call that begins at that message, so each is sent once.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from magnetar.instance.exceptions import InstanceError
from magnetar.instance.javascript._curl import UrlClient
from magnetar.instance.javascript._curl_runtime import FETCH_KIND
from magnetar.instance.javascript._engine import Interruption, ScriptEngine
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.state import StateStore
from magnetar.instance.timers import Timer, Timers, TimersUnavailable
from magnetar.topics import base_topic

__all__ = ["ScriptExecutor", "ScriptOutcome", "ScriptRun", "TimerFiring"]

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}
_Result = str | list[Any] | None
"""One input's result from V8 (see the prelude's wire format)."""
_MAX_RESTARTS = 3  # calls stopped before they began, in a row: the runtime is broken


@dataclass(slots=True)
class ScriptOutcome:
    """What one input came to."""

    output: bytes | None = None
    """The payload for the output topic; None when the function returned null/undefined."""
    publishes: list[tuple[str, bytes, dict[str, str] | None]] | None = None
    """``context.publish`` calls: topic, payload, properties."""
    ack: bool = False
    """The function called ``context.ack()``."""
    error: str | None = None
    """Why the input failed; None on success."""
    system: bool = False
    """The failure is not the function's (an undecodable input)."""
    wrote_state: bool = False
    """The function updated its state (the updates are applied when the outcome is handed
    out)."""


class TimerFiring:
    """A timer's firing, run through the executor like an input message: the script's
    top-level callback is called with the timer's stored context."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer

    def data(self) -> bytes:
        return json.dumps(self.timer.payload).encode()

    def topic_name(self) -> str:
        return ""

    def message_id(self) -> str:
        return f"timer {self.timer.reference!r}"

    def partition_key(self) -> str:
        return ""

    def event_timestamp(self) -> int:
        return 0

    def properties(self) -> dict[str, str]:
        return {}


class ScriptExecutor:
    """Runs the script's function over chunks of messages (one instance, one thread)."""

    def __init__(
        self,
        engine: ScriptEngine,
        json_inputs: dict[str, bool],
        json_patterns: list[re.Pattern[str]],
        state: StateStore,
        metrics: InstanceMetrics,
        logger: logging.Logger,
        timeout_ms: int,
        stop_on_error: bool,
        with_metadata: bool = True,
        urls: UrlClient | None = None,
    ) -> None:
        self.engine = engine
        self.urls = urls
        """Sends the script's ``curl`` requests (None: the function has no URL bindings)."""
        self.state = state
        self.metrics = metrics
        self.logger = logger
        self.timeout_ms = timeout_ms
        self.stop_on_error = stop_on_error
        """Stop a batch at its first failure (ordered subscriptions)."""
        self.with_metadata = with_metadata
        """Send each input's metadata (topic, id, key, ...) with it; otherwise it is sent
        once the function asks for it, and from then on."""
        self._json_inputs = dict(json_inputs)
        self._json_patterns = json_patterns
        self.call_id = 0
        self.timers: Timers | TimersUnavailable = TimersUnavailable(
            "timers need the function's state store, and this instance runs without one"
        )
        """What ``createTimer``/``cancelTimer`` arm and cancel (set by the instance)."""
        self.log_effects(engine.load_logs)

    def close(self) -> None:
        """Free the V8 context."""
        self.engine.close()

    def process(self, messages: list[Any]) -> ScriptRun:
        """The outcomes of ``messages``, in order, computed as they are asked for."""
        return ScriptRun(self, messages, [self._row(message) for message in messages])

    def _row(self, message: Any) -> list[Any]:
        if isinstance(message, TimerFiring):
            return [json.dumps(message.timer.payload), True, message.timer.callback]
        try:
            text: str | None = message.data().decode()
        except UnicodeDecodeError:
            text = None
        topic = message.topic_name()
        parse_json = self._json_inputs.get(topic)
        if parse_json is None:
            # a partition or a pattern match: the SerDe of its topic or pattern, else string
            parse_json = self._json_inputs.get(base_topic(topic)) or any(
                pattern.match(topic) for pattern in self._json_patterns
            )
            self._json_inputs[topic] = parse_json
        return [text, parse_json]

    @staticmethod
    def metadata(messages: list[Any]) -> str:
        """The JSON of the messages' metadata, as the prelude's context reads it."""
        return json.dumps(
            [
                [
                    message.topic_name(),
                    str(message.message_id()),
                    message.partition_key(),  # '' without a key, as in Python
                    message.event_timestamp(),
                    message.properties(),
                ]
                for message in messages
            ],
            separators=(",", ":"),
        )

    def log_effects(self, effects: list[list[Any]]) -> None:
        """Log the ``["l", level, text]`` effects through the function's logger."""
        for _, level, text in effects:
            self.logger.log(_LEVELS.get(level, logging.INFO), "%s", text)

    def record_latency(self, elapsed: float, count: int) -> None:
        """``count`` invocations took ``elapsed`` seconds together."""
        if not count:
            return
        metrics = self.metrics
        metrics.latency_total_s += elapsed
        metrics.latency_count += count
        metrics.latencies_s.extend([elapsed / count] * count)
        metrics.last_invocation_ms = int(time.time() * 1000)


class ScriptRun(Iterator[ScriptOutcome]):
    """The outcomes of one chunk. It ends early when ``stop_on_error`` stopped the batch at
    a failure (the last outcome): the inputs after it were not processed."""

    def __init__(
        self, executor: ScriptExecutor, messages: list[Any], rows: list[list[Any]]
    ) -> None:
        self._executor = executor
        self._messages = messages
        self._rows = rows
        self._batch: str | None = json.dumps(rows, separators=(",", ":"))
        self._metadata: str | None = executor.metadata(messages) if executor.with_metadata else None
        self._queue: deque[_Result | ScriptOutcome] = deque()
        """Results from V8 and failures found outside V8, in input order."""
        self._next = 0
        """Index of the input whose outcome is handed out next."""
        self._start = 0
        """Index of the input the next call into V8 begins with."""
        self._need: list[Any] | None = None
        self._answers: tuple[int, list[dict[str, Any]]] | None = None
        """The answers to the requests of the input at that index (see ``_curl``)."""
        self._requests_s = 0.0
        """Time spent in requests not yet counted in the latency of an outcome."""
        self._forget = False
        """The next call must drop what V8 knows of the state (``discard``)."""
        self._stopped = False

    def __next__(self) -> ScriptOutcome:
        while not self._queue:
            if self._stopped or self._start >= len(self._rows):
                raise StopIteration
            self._call()
        item = self._queue.popleft()
        message = self._messages[self._next]
        self._next += 1
        outcome = item if isinstance(item, ScriptOutcome) else self._outcome(item, message)
        if outcome.error is not None and self._executor.stop_on_error:
            self._stopped = True
        return outcome

    def discard(self) -> None:
        """The outcome just handed out failed after all (its state writes are rolled back):
        what V8 computed after it may have read those writes, so compute it again."""
        self._queue.clear()
        self._start = self._next
        self._forget = True

    # --- calls into V8 ------------------------------------------------------------------

    def _call(self) -> None:
        """One call into V8 from input ``_start``; queues what it found out."""
        executor = self._executor
        fetched: list[Any] = []
        if self._need is not None:
            # every outcome before this input has been handled: the read sees its writes
            kind, key = self._need
            self._need = None
            if kind == "m":  # the function reads metadata: send it, now and from now on
                executor.with_metadata = True
                self._metadata = executor.metadata(self._messages)
                return self._call()
            if kind == FETCH_KIND:
                self._request(key)
            else:
                try:
                    fetched.append(_read(executor.state, kind, key))
                except Exception as error:  # what a Python function's context would raise
                    self._queue.append(
                        ScriptOutcome(error=f"reading state key {key!r} failed: {_describe(error)}")
                    )
                    self._start += 1
                    return
        if self._answers is not None and self._answers[0] == self._start:
            fetched.append([FETCH_KIND, *self._answers])
        answer, reply, elapsed = self._eval(json.dumps(fetched) if fetched else "[]")
        self._batch, self._metadata, self._forget = None, None, False
        results = reply["r"]
        self._queue.extend(results)
        at = int(reply.get("at", -1))
        if "need" in reply:
            self._need = reply["need"]
            self._start = reply["next"]
        elif "at" not in reply:
            self._start = reply["next"]
        elif at < 0:
            pass  # stopped before its first input began: call again
        elif answer is Interruption.TIMEOUT and at > self._start:
            self._start = at  # the inputs before it used the budget: one of its own
        else:
            executor.log_effects(reply["logs"])
            self._queue.append(ScriptOutcome(error=self._interruption_error(answer)))
            self._start = at + 1
        executor.record_latency(elapsed + self._requests_s, len(self._queue))
        if self._queue:
            self._requests_s = 0.0

    def _request(self, spec: dict[str, Any]) -> None:
        """Send the request ``curl`` made in the input at ``_start``; its answer goes with
        every call that begins at that input."""
        if self._answers is None or self._answers[0] != self._start:
            self._answers = (self._start, [])
        urls = self._executor.urls
        started = time.perf_counter()
        self._answers[1].append(
            urls.answer(spec) if urls else {"error": "curl: this function has no URL bindings"}
        )
        self._requests_s += time.perf_counter() - started

    def _eval(self, fetched: str) -> tuple[str | Interruption, dict[str, Any], float]:
        executor = self._executor
        for restart in range(_MAX_RESTARTS + 1):
            executor.call_id += 1
            arguments = (
                f"[{executor.call_id},{self._start},{fetched},{self._batch or 'null'},"
                f"{self._metadata or 'null'},{'true' if self._forget else 'false'}]"
            )
            started = time.perf_counter()
            answer = executor.engine.run(arguments, executor.timeout_ms / 1000 * (1 + restart))
            elapsed = time.perf_counter() - started
            if isinstance(answer, Interruption):
                reply: dict[str, Any] = executor.engine.recover()
            else:
                reply = json.loads(answer)
            if reply["call"] == executor.call_id:
                return answer, reply, elapsed
            # V8 stopped it before the runtime began it (a large batch, a tiny time limit)
        raise InstanceError(
            f"V8 stopped {_MAX_RESTARTS + 1} calls in a row before they began ({answer})"
        )

    def _interruption_error(self, why: str | Interruption) -> str:
        executor = self._executor
        if why is Interruption.TIMEOUT:
            return f"the function ran longer than its timeout of {executor.timeout_ms} ms"
        limit_mib = executor.engine.memory_limit_bytes // (1024 * 1024)
        return f"the function exceeded the JavaScript heap limit of {limit_mib} MiB"

    # --- results ------------------------------------------------------------------------

    def _outcome(self, result: _Result, message: Any) -> ScriptOutcome:
        if result is None:
            return ScriptOutcome()
        if isinstance(result, str):
            return ScriptOutcome(_utf8(result))
        kind = result[0]
        if kind == 0:
            output = result[1]
            outcome = ScriptOutcome(None if output is None else _utf8(output))
            if result[2]:
                self._apply(result[2], outcome)
            return outcome
        if kind == 1:
            self._executor.log_effects(result[2])
            return ScriptOutcome(error=result[1])
        return ScriptOutcome(
            error=f"cannot deserialize message {message.message_id()} from "
            f"{message.topic_name()}: {result[1]}",
            system=True,
        )

    def _apply(self, effects: list[list[Any]], outcome: ScriptOutcome) -> None:
        executor = self._executor
        state = executor.state
        for effect in effects:
            kind = effect[0]
            try:
                if kind == "p":
                    if outcome.publishes is None:
                        outcome.publishes = []
                    outcome.publishes.append((effect[1], _utf8(effect[2]), effect[3]))
                elif kind == "l":
                    executor.logger.log(_LEVELS.get(effect[1], logging.INFO), "%s", effect[2])
                elif kind == "m":
                    executor.metrics.record_user_metric(effect[1], float(effect[2]))
                elif kind == "a":
                    outcome.ack = True
                elif kind == "t":
                    outcome.wrote_state = True
                    timer_context = json.loads(effect[4])
                    executor.timers.arm(effect[1], effect[2] / 1000, effect[3], timer_context)
                elif kind == "x":
                    outcome.wrote_state = True
                    executor.timers.cancel(effect[1])
                else:
                    outcome.wrote_state = True
                    if kind == "i":
                        state.incr(effect[1], effect[2])
                    elif kind == "d":
                        state.delete(effect[1])
                    else:
                        state.put(effect[1], _utf8(effect[2]))
            except Exception as error:  # what a Python function's context would have raised
                what = (
                    f"timer {effect[3]!r}"
                    if kind == "t"
                    else f"timer {effect[1]!r}"
                    if kind == "x"
                    else f"state key {effect[1]!r}"
                )
                outcome.error = f"updating {what} failed: {_describe(error)}"
                outcome.publishes = outcome.output = None
                self.discard()  # V8 believes the update was made
                return


def _read(state: StateStore, kind: str, key: str) -> list[Any]:
    if kind == "c":
        return [kind, key, state.get_counter(key)]
    value = state.get(key)
    return [kind, key, None if value is None else value.decode("utf-8", "replace")]


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _utf8(text: str) -> bytes:
    # a lone surrogate (possible in a JavaScript string) becomes U+FFFD
    return text.encode("utf-8", "replace")
