"""Giving an instance's function its timers: the ``TimerRunner`` of a Python function or of a
JavaScript script, wired to the instance's outputs, sends, journal and dead letters. A
function gets timers when its instance has the journaled state store (timers live in it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
from magnetar.instance.context import InstanceContext
from magnetar.instance.dead_letter import DeadLetters
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.exceptions import TimerCallbackError
from magnetar.instance.loader import LoadedFunction
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.options import InstanceOptions
from magnetar.instance.outputs import Outputs
from magnetar.instance.serde import SerDe
from magnetar.instance.state import StateStore
from magnetar.instance.timer_callbacks import PythonCallbacks, uses_timers
from magnetar.instance.timer_once import OnceFirings, OnceState
from magnetar.instance.timer_runner import TimerRunner, dead_letter_payload, timer_properties
from magnetar.instance.timers import Timer, Timers, TimerState

if TYPE_CHECKING:  # V8 is loaded only by the instances of JavaScript functions
    from magnetar.instance.javascript import ScriptExecutor

__all__ = ["TimerPlumbing"]


@dataclass(frozen=True)
class TimerPlumbing:
    """What a timer's firing goes through: the instance's parts."""

    config: FunctionConfig
    options: InstanceOptions
    state: StateStore
    outputs: Outputs
    sender: ChunkSender
    metrics: InstanceMetrics
    logger: logging.Logger
    current_chunk: Callable[[], Chunk]
    """The chunk being built (a firing's, while callbacks run)."""
    check_publish: Callable[[str], None]

    def python(
        self, function: LoadedFunction, context: InstanceContext, output_serde: SerDe
    ) -> TimerRunner | None:
        """Timers for a plain (not async, not window) Python function: ``context``'s
        ``create_timer``/``cancel_timer`` arm and cancel them; None without a state store."""
        callbacks = PythonCallbacks(function)
        context.timer_callback_name = callbacks.name
        if not isinstance(self.state, TimerState):
            return None
        timers = context.timers = Timers(self.state)

        def fire(timer: Timer) -> Any:
            context.set_message(None, "")
            return callbacks.find(timer.callback)(timer.payload, context)

        return self._runner(timers, fire, output_serde, uses_timers(function))

    def script(self, script: ScriptExecutor, source: str) -> TimerRunner | None:
        """Timers for a JavaScript function (``createTimer``/``cancelTimer``); None without
        a state store."""
        if not isinstance(self.state, TimerState):
            return None
        timers = script.timers = Timers(self.state)
        return self._runner(
            timers, lambda timer: self._fire_script(script, timer), None, "createTimer" in source
        )

    def _fire_script(self, script: ScriptExecutor, timer: Timer) -> Any:
        """Run a script's callback: its publishes go with the firing's chunk; what it
        returns is the output."""
        from magnetar.instance.javascript import TimerFiring

        outcome = next(script.process([TimerFiring(timer)]))
        if outcome.error is not None:
            raise TimerCallbackError(outcome.error)
        for topic, payload, properties in outcome.publishes or ():
            self.check_publish(topic)
            kwargs = {"properties": properties} if properties else {}
            self.sender.send(self.current_chunk(), self.outputs.producer(topic), payload, kwargs)
        return outcome.output

    def _runner(
        self,
        timers: Timers,
        fire: Callable[[Timer], Any],
        output_serde: SerDe | None,
        enabled: bool,
    ) -> TimerRunner:
        config, options, outputs, sender = self.config, self.options, self.outputs, self.sender
        dead_letters = DeadLetters(config, sender, outputs.producer)

        def encode(result: Any) -> bytes:
            return result if output_serde is None else output_serde.serialize(result)

        def send(chunk: Chunk, timer: Timer, result: Any) -> None:
            """A callback's result goes where ``process``'s go, with the timer's reference."""
            producer = outputs.output
            if producer is None and config.output:
                producer = outputs.producer(config.output)
            if producer is None:
                return
            sender.send(chunk, producer, encode(result), {"properties": timer_properties(timer)})

        assert isinstance(self.state, TimerState)
        return TimerRunner(
            timers,
            options.instance_id,
            config.parallelism,
            fire,
            send,
            lambda chunk, timer: dead_letters.send_timer(
                chunk, dead_letter_payload(timer), timer_properties(timer)
            ),
            self.state.rollback,
            self.metrics,
            self.logger,
            config.max_message_retries,
            options.retry_delay_ms / 1000,
            options.max_retry_delay_ms / 1000,
            enabled,
            self._once(timers, fire, encode),
        )

    def _once(
        self, timers: Timers, fire: Callable[[Timer], Any], encode: Callable[[Any], bytes]
    ) -> OnceFirings | None:
        """Exactly-once firings, for EFFECTIVELY_ONCE on a broker that may deduplicate
        (on pulsar-lite, which cannot, firings stay at least once)."""
        config, options, outputs = self.config, self.options, self.outputs
        effectively_once = config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
        if not (effectively_once and options.broker_may_deduplicate):
            return None
        assert isinstance(self.state, OnceState)
        fqfn = config.fqfn

        def report(timer: Timer, error: Exception) -> None:
            self.metrics.record_user_exception(error)
            self.logger.error("user exception firing timer %r again: %s", timer.reference, error)

        return OnceFirings(
            self.state,
            timers,
            options.instance_id,
            config.parallelism,
            outputs.timer_lane if outputs.deduplicated else lambda name: None,
            lambda lane: f"{fqfn}-timers-{lane}",
            fire,
            encode,
            timer_properties,
            self.sender,
            report,
            config.max_message_retries,
            has_output=outputs.deduplicated,
        )
