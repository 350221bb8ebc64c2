"""Healing the embedded broker: what pulsar-lite 0.2 leaves behind when a client dies.

pulsar-lite's connection task (``ServerCnx::run``) returns early, skipping its clean-up, when
reading from the socket fails: ``let frame = frame.map_err(..)?`` leaves the function instead
of the loop. A client killed while the broker was writing to it (bytes still unread in its
socket, so the kernel answers with a reset) therefore leaves its consumers on their
subscriptions for good, holding their permits and every message they were handed. Those
messages are never redelivered, and a Shared subscription keeps picking the dead consumer,
whose sends fail, so the live ones get less and less. When the reset is met while *writing*
instead, the task breaks out of its loop and cleans up: the dead consumer's messages go back
to the others. No command of another connection can remove a consumer (CloseConsumer,
Unsubscribe and RedeliverUnacknowledged act on the connection's own consumers; a subscribe
with the dead one's id is refused), so the process that owns the broker restarts it, on the
same port and data directory: every client reconnects by itself within a fraction of a second
and the subscriptions start over from what was acknowledged, so nothing is lost.

The broker's log tells the two endings apart. The clean-up path logs its error first
(``Error sending message batch to client: E``, ``Error handling command: E`` or
``Error during keep-alive processing: E``) and then, like the early return, ``Connection error
from PEER: E``; only the early return logs the latter alone. Apache Pulsar needs none of this.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrokerHealer", "Heal", "LeakDetector"]

log = logging.getLogger(__name__)

_CLEANED_UP = re.compile(
    r"\] (?:Error sending message batch to client|Error handling command|"
    r"Error during keep-alive processing): (?P<error>.*)$"
)
_CONNECTION_ERROR = re.compile(r"\] Connection error from (?P<peer>\S+): (?P<error>.*)$")


class LeakDetector:
    """Reads the broker's log line by line and names each connection that ended without
    its clean-up (its consumers stay on their subscriptions)."""

    def __init__(self) -> None:
        self._cleaned_up: Counter[str] = Counter()

    def feed(self, line: str) -> str | None:
        """The peer address of a connection that ended without clean-up, else None."""
        line = line.rstrip()
        cleaned = _CLEANED_UP.search(line)
        if cleaned:
            self._cleaned_up[cleaned["error"]] += 1
            return None
        ended = _CONNECTION_ERROR.search(line)
        if ended is None:
            return None
        error = ended["error"]
        if self._cleaned_up[error] > 0:
            self._cleaned_up[error] -= 1
            return None
        return ended["peer"]


@dataclass(frozen=True)
class Heal:
    """One restart of the broker by its healer."""

    at: float
    """When the cause was seen (``time.time()``)."""
    reason: str
    """What was wrong, in words."""
    took_s: float
    """From the cause seen until the broker accepted connections again."""


class BrokerHealer:
    """Watches a broker's log (and its process) from a thread and restarts it when needed.

    ``settle_s`` gathers the resets of a dying process tree into one restart, and restarts
    are at least ``min_interval_s`` apart, so that a client resetting its connections over
    and over cannot keep the broker down.
    """

    def __init__(
        self,
        log_path: Path,
        restart: Callable[[], None],
        has_exited: Callable[[], bool],
        poll_s: float = 0.05,
        settle_s: float = 0.1,
        min_interval_s: float = 1.0,
    ) -> None:
        self.log_path = log_path
        self._restart = restart
        self._has_exited = has_exited
        self.poll_s = poll_s
        self.settle_s = settle_s
        self.min_interval_s = min_interval_s
        self.heals: list[Heal] = []
        self._detector = LeakDetector()
        self._offset = self._size()
        self._partial = ""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-healer", daemon=True)

    def start(self) -> BrokerHealer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _run(self) -> None:
        failures = 0
        reason: str | None = None
        while not self._stopping.wait(self.poll_s):
            reason = reason or self._why_heal()
            if reason is None:
                continue
            seen = time.time()
            pause = self.settle_s
            if self.heals:
                last = self.heals[-1]
                pause = max(pause, self.min_interval_s - (seen - last.at - last.took_s))
            if self._stopping.wait(pause):
                return
            for line in self._read_lines():  # a dying process tree's other resets: one restart
                self._detector.feed(line)
            try:
                self._restart()
            except Exception as error:  # try again, a little later each time
                failures += 1
                log.error("could not restart the embedded broker (%s): %s", reason, error)
                self._stopping.wait(min(10.0, 0.5 * 2**failures))
                continue
            failures = 0
            heal = Heal(seen, reason, time.time() - seen)
            self.heals.append(heal)
            reason = None
            log.warning(
                "restarted the embedded broker in %.2f s: %s; clients reconnect by themselves",
                heal.took_s,
                heal.reason,
            )

    def _why_heal(self) -> str | None:
        if self._has_exited():
            return "pulsar-lite exited unexpectedly"
        peers = [peer for line in self._read_lines() if (peer := self._detector.feed(line))]
        if peers:
            return (
                f"the connection from {', '.join(peers)} ended in a reset without pulsar-lite "
                "removing its consumers (which would keep the messages they were handed)"
            )
        return None

    def _read_lines(self) -> list[str]:
        """The complete lines appended to the log since the last call."""
        try:
            with self.log_path.open("rb") as stream:
                stream.seek(self._offset)
                data = stream.read()
        except OSError:
            return []
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        return lines
