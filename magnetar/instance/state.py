"""The state seam between a function's Context and the state store.

The state-store issue backs this with the broker-journaled RocksDB table; until an
instance is given one, every state call fails with a message saying so.
"""

from __future__ import annotations

from typing import Protocol

from magnetar.instance.exceptions import StateNotConfiguredError

__all__ = ["StateStore", "UnconfiguredStateStore"]


class StateStore(Protocol):
    """A function's table of counters (signed 64-bit) and byte values."""

    def incr(self, key: str, amount: int) -> None: ...

    def get_counter(self, key: str) -> int: ...

    def put(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, key: str) -> None: ...


class UnconfiguredStateStore:
    """The store of an instance that runs without state: every call explains why it fails."""

    def __init__(self, fqfn: str) -> None:
        self._fqfn = fqfn

    def _fail(self) -> StateNotConfiguredError:
        return StateNotConfiguredError(
            f"state is not configured for function {self._fqfn}: this instance runs without a "
            "state store, so incr_counter/get_counter/del_counter/put_state/get_state "
            "are unavailable"
        )

    def incr(self, key: str, amount: int) -> None:
        raise self._fail()

    def get_counter(self, key: str) -> int:
        raise self._fail()

    def put(self, key: str, value: bytes) -> None:
        raise self._fail()

    def get(self, key: str) -> bytes | None:
        raise self._fail()

    def delete(self, key: str) -> None:
        raise self._fail()
