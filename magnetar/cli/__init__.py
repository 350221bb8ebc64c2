"""The `magnetar` command line (click)."""

from magnetar.cli.interrupts import STOP

STOP.install()  # first: a Ctrl-C while the rest loads is recorded (see interrupts)

from magnetar.cli.app import main  # noqa: E402 -- after the handlers, on purpose
from magnetar.cli.context import CliContext  # noqa: E402

__all__ = ["CliContext", "main"]
