"""The windows' checkpoint: what a restarted instance needs to resume its windows where they
were, kept in the function's state store under ``__window__/<instance id>``.

Inputs stay unacknowledged until no window can hold them any more, so after a restart the
broker delivers again every input still in a window; the checkpoint says which those are (by
position), where each stood in the windows, and the policies' state (counts, reference times,
watermarks), so no window is fired twice or loses an input. It also lists, as runs of
consecutive positions, the inputs recently acknowledged, whose acknowledgement may not have
reached the broker before a crash: delivered again, they are acknowledged, not windowed.

A checkpoint is written only once the outputs of every window it accounts for are persisted
(``CheckpointQueue``), so whichever checkpoint the store holds, resuming from it fires again
at most the windows after it, and never loses one.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from magnetar.instance.delivery import Chunk
from magnetar.instance.windowing.engine import EngineState
from magnetar.positions import Position

__all__ = [
    "Buffered",
    "Checkpoint",
    "CheckpointQueue",
    "DoneRuns",
    "checkpoint_key",
]

_VERSION = 1
DONE_RETENTION_MS = 30_000
"""How long acknowledged positions stay in checkpoints: far longer than a client takes to
send an acknowledgement."""


def checkpoint_key(instance_id: int) -> str:
    """The state key of an instance's window checkpoint."""
    return f"__window__/{instance_id}"


@dataclass(frozen=True)
class Buffered:
    """An input in the windows at checkpoint time."""

    topic: str
    position: Position
    timestamp: int
    in_last_window: bool


class DoneRuns:
    """Positions acknowledged (or about to be), per topic, as runs of consecutive positions:
    an input delivered once per entry, in order, makes one run per topic."""

    def __init__(self, runs: dict[str, list[list[Any]]] | None = None) -> None:
        self._runs: dict[str, list[list[Any]]] = runs or {}
        """topic -> [first position, last position, last extended (ms)]."""

    def add(self, topic: str, position: Position, now_ms: int) -> None:
        runs = self._runs.setdefault(topic, [])
        if runs:
            last = runs[-1]
            if _follows(last[1], position):
                last[1], last[2] = position, now_ms
                return
        runs.append([position, position, now_ms])

    def __contains__(self, key: tuple[str, Position]) -> bool:
        topic, position = key
        return any(first <= position <= last for first, last, _ in self._runs.get(topic, ()))

    def pruned(self, now_ms: int) -> dict[str, list[list[Any]]]:
        """A copy of the runs extended within ``DONE_RETENTION_MS``; the older ones are
        forgotten."""
        oldest = now_ms - DONE_RETENTION_MS
        self._runs = {
            topic: recent
            for topic, runs in self._runs.items()
            if (recent := [run for run in runs if run[2] >= oldest])
        }
        return {topic: [list(run) for run in runs] for topic, runs in self._runs.items()}


def _follows(last: Position, position: Position) -> bool:
    """Whether ``position`` comes right after ``last`` in its topic: the next message of the
    same batch, or the first of the next entry."""
    ledger, entry, batch = last
    if position[0] != ledger:
        return False
    if position[1] == entry:
        return batch >= 0 and position[2] == batch + 1
    return position[1] == entry + 1 and position[2] <= 0


@dataclass(frozen=True)
class Checkpoint:
    """The windows' state after a window fired (see the module docstring)."""

    fingerprint: str
    """The window config it was taken under: a checkpoint of another config is not used."""
    engine: EngineState
    watermark: int
    newest: dict[str, int]
    """Event time: the newest timestamp seen per topic."""
    buffered: list[Buffered]
    """The inputs in the windows, in arrival order."""
    done: dict[str, list[list[Any]]] = field(default_factory=dict)
    """See ``DoneRuns``."""

    def encode(self) -> bytes:
        engine = self.engine
        return json.dumps(
            {
                "version": _VERSION,
                "fingerprint": self.fingerprint,
                "engine": [
                    engine.counter,
                    engine.reference,
                    engine.delta,
                    engine.current_count,
                    engine.processed,
                    engine.next_window_end,
                    engine.last_processed_ts,
                ],
                "watermark": self.watermark,
                "newest": self.newest,
                "topics": (topics := sorted({b.topic for b in self.buffered})),
                "buffered": [
                    [topics.index(b.topic), *b.position, b.timestamp, int(b.in_last_window)]
                    for b in self.buffered
                ],
                "done": self.done,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Checkpoint:
        """Raises ``ValueError`` for a payload that is not a checkpoint of this version."""
        try:
            data = json.loads(payload)
            if data.get("version") != _VERSION:
                raise ValueError(f"unknown checkpoint version {data.get('version')!r}")
            topics = data["topics"]
            return cls(
                fingerprint=data["fingerprint"],
                engine=EngineState(*data["engine"]),
                watermark=int(data["watermark"]),
                newest={str(t): int(ts) for t, ts in data["newest"].items()},
                buffered=[
                    Buffered(topics[t], (ledger, entry, batch), ts, bool(last))
                    for t, ledger, entry, batch, ts, last in data["buffered"]
                ],
                done={
                    str(topic): [[tuple(first), tuple(last), int(at)] for first, last, at in runs]
                    for topic, runs in data["done"].items()
                },
            )
        except (KeyError, TypeError, IndexError, AttributeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a window checkpoint: {error!r}") from None


@dataclass
class _Pending:
    chunk: int
    checkpoint: Checkpoint
    acks: list[Any]
    source: tuple[str, Any]


class CheckpointQueue:
    """Checkpoints wait here until the chunks that sent their windows' outputs are persisted,
    and are written in order (only the newest of those ready: a later one covers an earlier).

    Every chunk the windows touch is tracked: a chunk that fails (a send failed: its outputs
    may be lost) marks the queue ``failed``; the windows then resume from the last checkpoint
    written, as after a restart.
    """

    def __init__(self) -> None:
        self._next_chunk = 0
        self._generation = 0
        """Bumped by ``reset``: chunks tracked before it no longer count."""
        self._in_flight: set[int] = set()
        self._pending: deque[_Pending] = deque()
        self.failed = False
        """A tracked chunk failed since the last ``reset``."""
        self.written: Checkpoint | None = None
        """The newest checkpoint handed out for writing."""
        self.on_failure: Callable[[Chunk], None] | None = None
        """Told (on the instance's thread) of the first tracked chunk that fails."""

    def track(self, chunk: Chunk) -> None:
        """Follow ``chunk``, the current chunk of the instance, until it settles."""
        number = self._next_chunk = self._next_chunk + 1
        generation = self._generation
        self._in_flight.add(number)

        def settled(chunk: Chunk) -> None:
            if generation != self._generation:
                return
            self._in_flight.discard(number)
            if (chunk.error or chunk.failed) and not self.failed:
                self.failed = True
                if self.on_failure is not None:
                    self.on_failure(chunk)

        chunk.on_settled = settled

    def add(self, checkpoint: Checkpoint, acks: list[Any], source: tuple[str, Any]) -> None:
        """A window's outputs went out in the current chunk: once it (and every chunk
        before it) is persisted, ``checkpoint`` can be written and ``acks`` acknowledged;
        ``source`` is the (topic, message id) of the input the journal records it for."""
        self._pending.append(_Pending(self._next_chunk, checkpoint, acks, source))

    def ready(self) -> tuple[Checkpoint | None, list[Any], tuple[str, Any] | None]:
        """The checkpoint to write now (if any), the inputs to acknowledge once it is
        persisted, and its source."""
        if self.failed:
            return None, [], None
        oldest = min(self._in_flight, default=self._next_chunk + 1)
        latest: _Pending | None = None
        acks: list[Any] = []
        while self._pending and self._pending[0].chunk < oldest:
            latest = self._pending.popleft()
            acks += latest.acks
        if latest is None:
            return None, acks, None
        self.written = latest.checkpoint
        return latest.checkpoint, acks, latest.source

    def waiting(self) -> bool:
        """Whether a checkpoint waits for its chunks."""
        return bool(self._pending)

    def has_ready(self) -> bool:
        """Whether ``ready`` has a checkpoint to write."""
        oldest = min(self._in_flight, default=self._next_chunk + 1)
        return bool(self._pending) and self._pending[0].chunk < oldest and not self.failed

    def reset(self) -> None:
        """Forget the waiting checkpoints and the chunks in flight (resuming from
        ``written``)."""
        self._generation += 1
        self._pending.clear()
        self._in_flight.clear()
        self.failed = False
