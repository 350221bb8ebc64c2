"""Timed waits that end on time: the calling thread's timer slack set to 1 ns.

Linux lets a timed wait overrun by the thread's timer slack (50 us by default) to batch
wake-ups. The instance polls its consumers without waiting (``receive(0)``) after each
message and again before flushing its outputs when idle; in the client each such poll is a
timed wait of zero, which the default slack stretched to about 100 us, twice per message of a
light stream, on its latency path. Threads the caller starts afterwards inherit the setting.
"""

from __future__ import annotations

import ctypes
import logging
import sys

__all__ = ["tighten_timer_slack"]

log = logging.getLogger(__name__)

_PR_SET_TIMERSLACK = 29  # <linux/prctl.h>
_ONE_NANOSECOND = 1  # 0 would mean "the default" to the kernel


def tighten_timer_slack() -> None:
    """Set the calling thread's timer slack to 1 ns (Linux; elsewhere nothing happens)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        failed = libc.prctl(_PR_SET_TIMERSLACK, _ONE_NANOSECOND, 0, 0, 0) != 0
    except (OSError, AttributeError):
        failed = True
    if failed:
        log.debug("could not set the timer slack: timed waits may overrun by 50 us")
