"""The seam between the instance and what runs its function over chunks of messages: a plain
Python function (``python_runner``), an async one (``async_runner``) or a JavaScript script
(``script_runner``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from magnetar.instance.delivery import Chunk
from magnetar.instance.positions import RedeliveryFilter
from magnetar.instance.retries import Received

__all__ = ["Acking", "Runner"]


@dataclass(frozen=True)
class Acking:
    """When inputs are acknowledged, from the processing guarantees."""

    on_receipt: bool
    """ATMOST_ONCE: on receipt, before processing."""
    after_processing: bool
    """ATLEAST_ONCE and EFFECTIVELY_ONCE with autoAck: once the outputs are persisted."""
    redeliveries: RedeliveryFilter | None
    """EFFECTIVELY_ONCE: skips inputs applied before."""


class Runner(Protocol):
    """Runs the function over chunks of messages on the instance's thread."""

    @property
    def busy(self) -> bool:
        """Work is in flight that ``run`` must come back for, even without new messages."""
        ...

    def run(self, chunk: Chunk, received: list[Received]) -> None:
        """Process ``received`` in order as part of ``chunk``."""
        ...

    def timeouts(self) -> AbstractContextManager[None]:
        """While open, invocations are held to ``timeoutMs``."""
        ...

    def wait(self, chunk: Chunk, timeout_s: float) -> None:
        """On stop: finish what is in flight, within ``timeout_s``."""
        ...

    def close(self) -> None: ...
