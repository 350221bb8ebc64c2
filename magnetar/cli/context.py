"""What every command knows from the global options."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CliContext"]


@dataclass(frozen=True)
class CliContext:
    """Global options every command can read through ``click.get_current_context().obj``."""

    admin_url: str
    """The worker's REST admin URL."""
    broker_url: str | None
    """The Pulsar service URL; None where a command may start the embedded broker."""
    auth_token: str | None
    """Bearer token sent to the admin API (a JWT when the worker checks tokens)."""
    output: str
    """``table`` for people, ``json`` for programs."""
