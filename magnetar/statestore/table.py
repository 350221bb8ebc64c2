"""``StateTable``: a function's state journal replayed into a RocksDB database of its own.

The table tails the journal on a thread of its own. Updates collect in memory (where reads
see them at once) and are written in one RocksDB write batch together with the journal
position they reach, every ``flush_ops`` operations and whenever the journal goes quiet, so
the database always holds a journal prefix and a restart resumes right after it.

Rules, the same on every replica because the journal's order is the same for everyone:

* counters add (signed 64-bit, wrapping), ``PUT`` replaces, ``DELETE`` removes;
* a record of an EFFECTIVELY_ONCE writer whose input position is not after the last one
  applied from that input partition is a replay of an input applied before: it is skipped,
  so an input's updates count once even when the input is processed again after a crash;
* ``EXPECT`` applies the rest of its record only if its key holds its value then;
* ``CLEAR`` (a deleted function) empties the table and raises the minimum epoch, so records
  that instances of the deleted function still send afterwards are dropped.

A database that is missing is built from the latest snapshot and the journal; one that cannot
be opened (corrupt) is logged, deleted and built the same way.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
from rocksdict import Options, Rdict, WriteBatch

from magnetar.client import open_reader
from magnetar.positions import NOTHING, AppliedPositions, Position
from magnetar.statestore.exceptions import StateJournalError, StateStoreError
from magnetar.statestore.records import (
    CLEAR,
    EXPECT,
    Entry,
    JournalMessage,
    StateEntry,
    apply_op,
    decode_message,
    holds,
)
from magnetar.statestore.snapshots import Snapshot, load_latest_snapshot, publish_snapshot
from magnetar.tailer import TopicTailer

__all__ = ["StateTable"]

log = logging.getLogger(__name__)

_KEY, _KEY_END = b"k", b"l"
_RECENT, _RECENT_END = b"r", b"s"  # r<topic>\0<position>: applied positions in the window
_SOURCE, _SOURCE_END = b"s", b"t"  # s<topic>: the floor of the applied positions
_POSITION = b"m:position"
_EPOCH = b"m:epoch"
_I64 = struct.Struct(">q")
_COUNTER = struct.Struct(">qq")
_POS = struct.Struct(">qqi")
_MISSING = object()
_DEDUP_WINDOW = 100_000
"""Input positions remembered per partition above the floor (EFFECTIVELY_ONCE)."""
_CHECKPOINT_READ_MS = 5000


def encode_entry(entry: Entry) -> bytes:
    """An entry as the database stores it."""
    is_counter, data, version = entry
    if is_counter:
        return b"\x00" + _COUNTER.pack(data, version)
    return b"\x01" + _I64.pack(version) + bytes(data)


def decode_entry(raw: bytes) -> Entry:
    if raw[0] == 0:
        value, version = _COUNTER.unpack_from(raw, 1)
        return (True, value, version)
    (version,) = _I64.unpack_from(raw, 1)
    return (False, raw[9:], version)


class StateTable:
    """One function's table, materialized from its journal into ``directory``.

    ``own_writer`` is the writer id of the process's own journal messages: the table counts
    how far it has applied them (``read`` returns it), so the process can tell which of its
    updates the table already holds. With ``snapshot_every`` > 0 the table publishes a
    snapshot to ``snapshot_topic`` once that many operations were applied since the last one.
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        directory: Path,
        *,
        snapshot_topic: str | None = None,
        snapshot_every: int = 0,
        own_writer: int = 0,
        flush_ops: int = 50_000,
        name: str = "",
    ) -> None:
        self.topic = topic
        self.directory = directory
        self.lock = threading.Lock()
        """Held while applying and reading, so a reader sees whole journal messages."""
        self.applied_ops = 0
        """Operations applied since this table started (for benchmarks and tests)."""
        self._client = client
        self._snapshot_topic = snapshot_topic
        self._snapshot_every = snapshot_every
        self._own_writer = own_writer
        self._flush_ops = flush_ops
        self._name = name or topic.rsplit("/", 1)[-1]
        self._db: Rdict | None = None
        self._tailer: TopicTailer | None = None
        self._dirty: dict[bytes, Entry | None] = {}
        self._cleared = False
        self._sources: dict[str, AppliedPositions] = {}
        self._dirty_floors: set[str] = set()
        self._dirty_recent: dict[bytes, bool] = {}
        self._min_epoch = 0
        self._position_id = b""
        self._flushed_position_id = b""
        self._unflushed = 0
        self._since_snapshot = 0
        self._confirmed_seq = 0
        self._flush_lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> StateTable:
        """Open (or build) the database and start tailing the journal after its checkpoint."""
        self._db = self._open_db()
        self._load_meta()
        if self._position_id and not self._checkpoint_in_journal():
            log.warning(
                "the state database %s was built from another journal than %s (another "
                "broker's, or a deleted one); rebuilding it",
                self.directory,
                self.topic,
            )
            self._db.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            self._db = self._open_db()
            self._load_meta()
        if not self._position_id and self._snapshot_topic is not None:
            self._load_snapshot()
        start_after = pulsar.MessageId.deserialize(self._position_id) if self._position_id else None
        self._tailer = TopicTailer(
            self._client,
            self.topic,
            self._apply_message,
            f"state {self._name}",
            start_after=start_after,
            on_idle=self._on_idle,
        )
        self._tailer.start()
        return self

    def _checkpoint_in_journal(self) -> bool:
        """Whether the journal holds the message the checkpoint names."""
        checkpoint = pulsar.MessageId.deserialize(self._position_id)
        reader = open_reader(self._client, self.topic, checkpoint, start_message_id_inclusive=True)
        try:
            found = reader.read_next(_CHECKPOINT_READ_MS).message_id()
        except pulsar.Timeout:
            return False
        finally:
            reader.close()
        return (found.ledger_id(), found.entry_id()) == (
            checkpoint.ledger_id(),
            checkpoint.entry_id(),
        )

    def stop(self) -> None:
        """Stop tailing and write what was applied (a restart resumes from there)."""
        if self._tailer is not None:
            self._tailer.stop()
            self._tailer = None
        if self._db is not None:
            self.flush()
            self._db.close()
            self._db = None

    def wait_caught_up(self, timeout: float) -> bool:
        """Wait until the journal as it was when the table started has been applied."""
        assert self._tailer is not None
        return self._tailer.wait_caught_up(timeout)

    def catch_up(self, timeout: float) -> None:
        """Apply everything journaled so far; StateJournalError after ``timeout``."""
        assert self._tailer is not None
        if not self._tailer.catch_up(timeout):
            raise StateJournalError(
                f"the state journal {self.topic} could not be read to its end within "
                f"{timeout:.0f} s; is the broker reachable?"
            )

    def wait_applied(self, message_id: Any, timeout: float) -> bool:
        """Wait until the journal message ``message_id`` has been applied."""
        assert self._tailer is not None
        return self._tailer.wait_applied(message_id, timeout)

    @property
    def confirmed_seq(self) -> int:
        """The sequence number of the last of ``own_writer``'s records applied (or skipped)."""
        return self._confirmed_seq

    # --- reads ----------------------------------------------------------------------------

    def get(self, key: str) -> StateEntry | None:
        """A key's state as applied so far; None when the key does not exist."""
        entry, _ = self.read(key.encode())
        return None if entry is None else StateEntry.of(entry)

    def read(self, key: bytes) -> tuple[Entry | None, int]:
        """A key's entry and how far this process's own records have been applied."""
        with self.lock:
            return self._lookup(key), self._confirmed_seq

    def scan(self, start: bytes, stop: bytes, limit: int) -> list[tuple[bytes, Entry]]:
        """Up to ``limit`` entries with ``start`` <= key < ``stop``, in key order. What was
        applied is written first, so the database alone answers in order."""
        self.flush()
        found: list[tuple[bytes, Entry]] = []
        with self.lock:
            if self._db is None:
                return found
            low, high = _KEY + start, _KEY + stop
            for key, raw in self._db.items(from_key=low):
                raw_key = key if isinstance(key, bytes) else str(key).encode()
                if raw_key >= high or len(found) >= limit:
                    break
                found.append((raw_key[len(_KEY) :], decode_entry(raw)))
        return found

    def _lookup(self, key: bytes) -> Entry | None:
        entry = self._dirty.get(key, _MISSING)
        if entry is not _MISSING:
            return entry  # type: ignore[return-value]
        if self._cleared or self._db is None:
            return None
        raw = self._db.get(_KEY + key)
        return None if raw is None else decode_entry(raw)

    # --- applying the journal --------------------------------------------------------------

    def _apply_message(self, message: Any) -> None:
        message_id = message.message_id()
        try:
            journal = decode_message(message.data())
        except ValueError as error:
            log.warning("skipping message %s of %s: %s", message_id, self.topic, error)
            journal = None
        with self.lock:
            if journal is not None:
                self._apply(journal)
            self._position_id = message_id.serialize()
        if self._unflushed >= self._flush_ops:
            self.flush()

    def _apply(self, journal: JournalMessage) -> None:
        own = journal.writer_id == self._own_writer
        if journal.epoch < self._min_epoch:
            if own and journal.records:
                self._confirmed_seq = journal.records[-1].seq
            return  # written by an instance of a deleted function
        dirty = self._dirty
        for record in journal.records:
            if own:
                self._confirmed_seq = record.seq
            topic = record.source_topic
            if journal.dedup and topic and not self._first_time(topic, record.source):
                continue  # this input's updates are applied already
            for kind, key, arg in record.ops:
                if kind == CLEAR:
                    self._clear(journal.epoch)
                    continue
                if kind == EXPECT:
                    if not holds(self._lookup(key), arg):
                        break  # the rest of the record does not apply
                    continue
                dirty[key] = apply_op(self._lookup(key), kind, arg)
            self._unflushed += len(record.ops)
            self._since_snapshot += len(record.ops)
            self.applied_ops += len(record.ops)

    def _first_time(self, topic: str, source: Position) -> bool:
        """Whether an EFFECTIVELY_ONCE record of input ``source`` is the first one; it is
        noted as applied (in the database with the next flush)."""
        applied = self._sources.get(topic)
        if applied is None:
            applied = self._sources[topic] = AppliedPositions(_DEDUP_WINDOW)
        if source in applied:
            return False
        prefix = _RECENT + topic.encode() + b"\x00"
        self._dirty_recent[prefix + _POS.pack(*source)] = True
        left = applied.add(source)
        if left is not None:
            self._dirty_recent[prefix + _POS.pack(*left)] = False
            self._dirty_floors.add(topic)
        return True

    def _clear(self, epoch: int) -> None:
        self._dirty.clear()
        self._cleared = True
        self._sources.clear()
        self._dirty_floors.clear()
        self._dirty_recent.clear()
        self._min_epoch = max(self._min_epoch, epoch)

    def flush(self) -> None:
        """Write the applied updates and the journal position in one batch."""
        with self._flush_lock, self.lock:
            db = self._db
            changed = self._dirty or self._cleared or self._dirty_recent
            if db is None or not (changed or self._position_id != self._flushed_position_id):
                return
            batch = WriteBatch(raw_mode=True)
            if self._cleared:
                batch.delete_range(_KEY, _KEY_END)
                batch.delete_range(_RECENT, _RECENT_END)
                batch.delete_range(_SOURCE, _SOURCE_END)
            for key, entry in self._dirty.items():
                if entry is None:
                    batch.delete(_KEY + key)
                else:
                    batch.put(_KEY + key, encode_entry(entry))
            for key, present in self._dirty_recent.items():
                if present:
                    batch.put(key, b"")
                else:
                    batch.delete(key)
            for topic in self._dirty_floors:
                batch.put(_SOURCE + topic.encode(), _POS.pack(*self._sources[topic].floor))
            if self._position_id:
                batch.put(_POSITION, self._position_id)
            batch.put(_EPOCH, _I64.pack(self._min_epoch))
            db.write(batch)
            self._dirty = {}
            self._dirty_recent = {}
            self._dirty_floors.clear()
            self._cleared = False
            self._unflushed = 0
            self._flushed_position_id = self._position_id

    def _on_idle(self) -> None:
        self.flush()
        if self._snapshot_every and self._since_snapshot >= self._snapshot_every:
            self.publish_snapshot()

    # --- snapshots ------------------------------------------------------------------------

    def publish_snapshot(self) -> None:
        """Publish the table as it is now to the snapshot topic."""
        assert self._snapshot_topic is not None
        self.flush()
        with self.lock:
            db = self._db
            if db is None or not self._position_id:
                return
            view = db.snapshot()
            snapshot = Snapshot(self._position_id, self._min_epoch)
            self._since_snapshot = 0
        started = time.monotonic()
        parts = publish_snapshot(self._client, self._snapshot_topic, snapshot, _items(view))
        log.info(
            "published a snapshot of %s (%d parts) in %.2f s",
            self._name,
            parts,
            time.monotonic() - started,
        )

    def _load_snapshot(self) -> None:
        assert self._db is not None and self._snapshot_topic is not None
        try:
            found = load_latest_snapshot(self._client, self._snapshot_topic)
        except Exception as error:
            log.warning(
                "cannot read the snapshots of %s (%s); replaying its journal from the start",
                self._name,
                error,
            )
            return
        if found is None:
            return
        snapshot, items = found
        batch = WriteBatch(raw_mode=True)
        count = 0
        for key, value in items:
            batch.put(key, value)
            count += key.startswith(_KEY)
            if count % 10_000 == 0:
                self._db.write(batch)
                batch = WriteBatch(raw_mode=True)
        batch.put(_EPOCH, _I64.pack(snapshot.min_epoch))
        batch.put(_POSITION, snapshot.position_id)  # last: the checkpoint of a complete load
        self._db.write(batch)
        self._load_meta()
        log.info("loaded %s from a snapshot (%d keys)", self._name, count)

    # --- the database ---------------------------------------------------------------------

    def _open_db(self) -> Rdict:
        path = self.directory
        if not path.exists():
            log.info("no state database at %s: building %s from the journal", path, self._name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            db = Rdict(str(path), Options(raw_mode=True))
            self._check(db)
            return db
        except Exception as error:
            if "lock" in str(error).lower():
                raise StateStoreError(
                    f"the state database {path} is in use by another process: {error}"
                ) from None
            log.warning(
                "the state database %s is unusable (%s); deleting it and rebuilding %s from "
                "the journal",
                path,
                error,
                self._name,
            )
        shutil.rmtree(path, ignore_errors=True)
        return Rdict(str(path), Options(raw_mode=True))

    @staticmethod
    def _check(db: Rdict) -> None:
        """Raise when the checkpoint cannot be read back (a corrupt database)."""
        raw = db.get(_POSITION)
        if raw is not None:
            pulsar.MessageId.deserialize(raw)
        epoch = db.get(_EPOCH)
        if epoch is not None:
            _I64.unpack(epoch)

    def _load_meta(self) -> None:
        assert self._db is not None
        self._position_id = self._flushed_position_id = self._db.get(_POSITION) or b""
        raw_epoch = self._db.get(_EPOCH)
        self._min_epoch = _I64.unpack(raw_epoch)[0] if raw_epoch else 0
        floors = {key[1:].decode(): _POS.unpack(value) for key, value in _range(self._db, _SOURCE)}
        recent: dict[str, list[Position]] = {}
        for key, _ in _range(self._db, _RECENT):
            topic, _, raw = key[1:].partition(b"\x00")
            recent.setdefault(topic.decode(), []).append(_POS.unpack(raw))
        self._sources = {
            topic: AppliedPositions(
                _DEDUP_WINDOW, floors.get(topic, NOTHING), recent.get(topic, ())
            )
            for topic in floors.keys() | recent.keys()
        }


def _range(db: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in db.items(from_key=prefix):
        if not key.startswith(prefix):
            return
        yield key, value


def _items(view: Any) -> Iterator[tuple[bytes, bytes]]:
    """Everything a snapshot holds: the entries and the applied input positions (the
    checkpoint goes in its manifest)."""
    for prefix in (_KEY, _RECENT, _SOURCE):
        yield from _range(view, prefix)
