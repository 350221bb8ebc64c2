"""The `magnetar` command line (click)."""

from magnetar.cli.app import main
from magnetar.cli.context import CliContext

__all__ = ["CliContext", "main"]
