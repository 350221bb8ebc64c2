"""`magnetar functions ...`: the `pulsar-admin functions` commands.

The commands that manage functions on a cluster are in ``function_admin``, the state
commands in ``state`` and ``localrun`` in ``localrun``.
"""

from __future__ import annotations

import click

from magnetar.cli.function_admin import register_admin_commands
from magnetar.cli.interrupts import STOP
from magnetar.cli.localrun import localrun
from magnetar.cli.state import putstate, querystate
from magnetar.cli.timers import timers

__all__ = ["functions"]


@click.group()
@click.pass_context
def functions(ctx: click.Context) -> None:
    """Manage and run functions (like `pulsar-admin functions`)."""
    if ctx.invoked_subcommand != "localrun":
        STOP.release()  # localrun stops on a request; every other command as click does


register_admin_commands(functions)
functions.add_command(querystate)
functions.add_command(putstate)
functions.add_command(timers)
functions.add_command(localrun)
