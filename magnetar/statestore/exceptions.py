"""Errors of the state store."""

from magnetar.exceptions import MagnetarError

__all__ = [
    "InvalidStateUpdateError",
    "StateJournalError",
    "StateStoreError",
    "StateTooLargeError",
    "StateTypeError",
]


class StateStoreError(MagnetarError):
    """Base class of the state store's errors."""


class InvalidStateUpdateError(StateStoreError):
    """A state update that cannot be applied: an empty or too long key, or a counter amount
    that is not a signed 64-bit integer. The message names the key and what was wrong."""


class StateTooLargeError(InvalidStateUpdateError):
    """A value, or the updates of one input message, above the state store's limits."""


class StateTypeError(StateStoreError):
    """A counter read of a key that holds a value (``put_state``), not a counter."""


class StateJournalError(StateStoreError):
    """The state journal on the broker could not be read or written in time."""
