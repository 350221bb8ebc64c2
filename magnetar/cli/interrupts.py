"""Ctrl-C and SIGTERM as recorded requests, never as exceptions.

A handler that raises (KeyboardInterrupt, SystemExit) can fire inside anything: an import, a
``finally`` clause, a ``__del__`` whose exception Python only reports, a subprocess being
forked; so a stop asked for at the wrong moment could be lost (the command then ran on) or end
the process by the signal after all. Here the handler only records the request and tells a
listener; the command checks for it where stopping is safe. ``magnetar.cli`` installs it first
thing; ``main`` hands Ctrl-C back to click's usual handling for every command that does not
take it over itself (localrun does).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

__all__ = ["STOP", "StopRequests"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """Counts SIGINT/SIGTERM while installed and calls the listener on each."""

    def __init__(self) -> None:
        self.count = 0
        self._listener: Callable[[], None] | None = None

    @property
    def requested(self) -> bool:
        return self.count > 0

    def install(self) -> None:
        for signum in _SIGNALS:
            signal.signal(signum, self._on_signal)

    def release(self) -> None:
        """The usual handling again: KeyboardInterrupt on Ctrl-C, termination on SIGTERM."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` on every request from now on (once now, if one came already)."""
        self._listener = listener
        if listener is not None and self.requested:
            listener()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self._listener is not None:
            self._listener()


STOP = StopRequests()
"""The process's stop requests (the command line is one process, one handler)."""
