"""The state seam between a function's Context and the state store.

``magnetar.statestore.JournaledStateStore`` backs it with the broker-journaled RocksDB
table; an instance given no store fails every state call with a message saying so.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from magnetar.instance.exceptions import StateNotConfiguredError

__all__ = ["JournaledState", "StateStore", "UnconfiguredStateStore"]


class StateStore(Protocol):
    """A function's table of counters (signed 64-bit) and byte values."""

    def incr(self, key: str, amount: int) -> None: ...

    def get_counter(self, key: str) -> int: ...

    def put(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, key: str) -> None: ...


@runtime_checkable
class JournaledState(StateStore, Protocol):
    """A store whose updates the instance journals: the updates made while processing one
    input become one record (``commit``) or are dropped (``rollback``); the records of a
    chunk of inputs are sent on the instance's producer for ``journal_topic`` (``drain``),
    so the inputs are acknowledged only once their state is persisted, and ``settle``
    reports how the sends ended."""

    journal_topic: str

    def commit(self, topic: str, message_id: Any) -> None: ...

    def rollback(self) -> None: ...

    def drain(self) -> tuple[list[bytes], Any]: ...

    def settle(self, batch: Any, persisted: bool) -> None: ...


class UnconfiguredStateStore:
    """The store of an instance that runs without state: every call explains why it fails."""

    def __init__(self, fqfn: str, reason: str | None = None) -> None:
        """``reason``: why state is unavailable, when it is not that none is configured."""
        self._message = reason or (
            f"state is not configured for function {fqfn}: this instance runs without a "
            "state store, so incr_counter/get_counter/del_counter/put_state/get_state "
            "are unavailable"
        )

    def _fail(self) -> StateNotConfiguredError:
        return StateNotConfiguredError(self._message)

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
