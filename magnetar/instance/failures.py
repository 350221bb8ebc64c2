"""What happens when the function fails on a message: it is counted (status and metrics),
its state updates are dropped, and it is retried after a backoff or, its retries used up,
sent to the dead-letter topic. The traceback is logged once per message, not per attempt."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from magnetar.instance.dead_letter import DeadLetters
from magnetar.instance.delivery import Chunk
from magnetar.instance.exceptions import SerDeError
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.retries import RetryQueue
from magnetar.instance.state import JournaledState

__all__ = ["FailureHandler"]


class FailureHandler:
    """Handles the failures of one instance's function."""

    def __init__(
        self,
        metrics: InstanceMetrics,
        logger: logging.Logger,
        retries: RetryQueue,
        dead_letters: DeadLetters,
        journal: JournaledState | None,
        retry: bool,
        on_retry: Callable[[Any], None] | None = None,
    ) -> None:
        """``retry``: whether failed messages are processed again (not under ATMOST_ONCE,
        which acknowledged them on receipt); ``on_retry(message_id)`` is told of each
        message that will be processed again."""
        self._metrics = metrics
        self._logger = logger
        self._retries = retries
        self._dead_letters = dead_letters
        self._journal = journal
        self._retry = retry
        self._on_retry = on_retry

    def fail(
        self,
        consumer: Any,
        message: Any,
        error: BaseException | str,
        chunk: Chunk,
        system: bool = False,
        earlier: int = 0,
    ) -> bool:
        """The function failed on ``message`` (``system``: not the function's fault, such
        as an input its SerDe cannot read); whether it will be processed again. ``earlier``:
        failures counted before this process (see ``crashed``)."""
        if self._journal is not None:
            self._journal.rollback()  # its state updates are made again when it is retried
        if isinstance(error, MemoryError):  # Python's says nothing: say what ran out
            detail = f": {error}" if str(error) else ""
            error = f"MemoryError: out of memory (the instance is limited by resources.ram){detail}"
        system = system or isinstance(error, SerDeError)
        if system:
            self._metrics.record_system_exception(error)
        else:
            self._metrics.record_user_exception(error)
        kind = "system error" if system else "user exception"
        where = f"message {message.message_id()} from {message.topic_name()}"
        if not self._retry:
            self._log_first(kind, where, error)
            return False
        attempt = self._retries.failed(consumer, message, earlier)
        if attempt.failures == 1:
            self._log_first(kind, where, error)
        if attempt.retried:
            if attempt.failures > 1:
                self._logger.warning(
                    "%s failed again (%d failures): %s", where, attempt.failures, error
                )
            if self._on_retry is not None:
                self._on_retry(message.message_id())
            return True
        topic = self._dead_letters.send(chunk, message)
        chunk.inputs.append((consumer, message))  # acknowledged once the dead letter is stored
        self._metrics.dead_lettered += 1
        self._logger.warning(
            "%s went to the dead-letter topic %s after %d failures: %s",
            where,
            topic,
            attempt.failures,
            error,
        )
        return False

    def crashed(self, consumer: Any, message: Any, crashes: int, chunk: Chunk) -> bool:
        """Earlier processes of this instance died ``crashes`` times with ``message`` in user
        code: that is a failure of the message (the last death is the failure handled now), so
        it is retried or, its retries used up, dead-lettered like any other; whether it will
        be processed again."""
        error = (
            f"the instance process died while the function processed this message "
            f"({crashes} time{'s' if crashes > 1 else ''})"
        )
        return self.fail(consumer, message, error, chunk, earlier=crashes - 1)

    def _log_first(self, kind: str, where: str, error: BaseException | str) -> None:
        self._logger.error(
            "%s processing %s: %s",
            kind,
            where,
            error,
            exc_info=error if isinstance(error, BaseException) else None,
        )
