"""The `magnetar` command line (click)."""

import signal
from types import FrameType


def _stop_quietly(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C (or SIGTERM) while the command line is still starting: nothing has begun, so
    there is nothing to finish or report; ``main`` puts the usual handling back."""
    raise SystemExit(0)


signal.signal(signal.SIGINT, _stop_quietly)
signal.signal(signal.SIGTERM, _stop_quietly)

from magnetar.cli.app import main  # noqa: E402 -- after the handlers, on purpose
from magnetar.cli.context import CliContext  # noqa: E402

__all__ = ["CliContext", "main"]
