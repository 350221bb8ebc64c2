"""The `magnetar` command line (click)."""

from magnetar.cli.app import CliContext, main

__all__ = ["CliContext", "main"]
