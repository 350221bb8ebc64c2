"""A click group whose commands are imported only when they run.

A command line answers in the time Python takes to import what it needs: the worker (FastAPI),
Spark, the pulsar client and pydantic cost a second together, and `magnetar functions list`
needs none of them. So each group names its commands' modules, and only the one invoked is
imported (``--help`` imports them all, to show their summaries).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["LazyGroup"]


class LazyGroup(click.Group):
    """A ``click.Group`` with commands given as ``{"name": "module:attribute"}``."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy_commands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command
