"""`magnetar functions ...`: the `pulsar-admin functions` commands.

The commands that manage functions on a cluster are in ``function_admin``, the state
commands in ``state`` and ``localrun`` in ``localrun``.
"""

from __future__ import annotations

import click

from magnetar.cli.function_admin import register_admin_commands
from magnetar.cli.localrun import localrun
from magnetar.cli.state import putstate, querystate

__all__ = ["functions"]


@click.group()
def functions() -> None:
    """Manage and run functions (like `pulsar-admin functions`)."""


register_admin_commands(functions)
functions.add_command(querystate)
functions.add_command(putstate)
functions.add_command(localrun)
