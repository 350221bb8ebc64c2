"""``JournaledStateStore``: the state a function instance's Context reads and writes.

The updates a function makes while processing one input collect in memory; when the input
has been processed successfully they become one journal record (``commit``), and a failed
invocation's updates are dropped (``rollback``), so a retried input never counts twice. The
instance sends the records of the inputs it processed together as one journal message, on a
producer of its delivery mechanism: the inputs are acknowledged only once the message is
persisted, and a failed write has them redelivered.

Reads are lazy, so a function that only writes (a word count) pays nothing for them: the
first read opens the instance's RocksDB table, replays the journal into it (from its
checkpoint, or the latest snapshot) and keeps tailing it, so reads see the other instances'
updates once they are journaled. The instance's own updates are visible at once: a read is
the table plus the instance's records that the table does not hold yet (in flight, or not
yet tailed), plus the current input's updates.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar

from magnetar.statestore.exceptions import StateTooLargeError, StateTypeError
from magnetar.statestore.journal import (
    DEFAULT_NAMESPACE,
    journal_topic,
    new_writer_id,
    snapshot_topic,
)
from magnetar.statestore.records import (
    DELETE,
    EXPECT,
    INCR,
    INT64,
    INT64_MAX,
    INT64_MIN,
    MAX_KEY_BYTES,
    MAX_RECORD_BYTES,
    OP_HEADER,
    PUT,
    RECORD_HEADER,
    SOURCE,
    U32,
    Entry,
    Op,
    apply_op,
    check_amount,
    check_value,
    decode_records,
    encode_message,
    state_key,
)
from magnetar.statestore.table import StateTable

__all__ = ["JournaledStateStore", "StateOptions"]

log = logging.getLogger(__name__)

_MESSAGE_BYTES = 1024 * 1024
"""Records are packed into journal messages of about this size (one record may be bigger)."""

Batch = tuple[int, int]
"""The first and last sequence number of the records sent together."""


@dataclass(frozen=True)
class StateOptions:
    """Where an instance keeps its state (picklable: it travels to instance processes)."""

    directory: str
    """This instance's own RocksDB directory (one process per database)."""
    namespace: str = DEFAULT_NAMESPACE
    """Namespace of the journal and snapshot topics (the worker's system namespace)."""
    epoch: int = 0
    """The function's version: a deleted function's records are told apart by it."""
    catch_up_timeout_s: float = 60.0
    """Longest wait for the table to catch up with the journal on the first read."""


def _record_head(topic: str) -> tuple[struct.Struct, int, bytes]:
    """A record's header, input topic and input position (``RECORD_HEADER`` + the topic +
    ``SOURCE``) as one struct, with the topic's length and bytes."""
    name = topic.encode()
    layout = RECORD_HEADER.format + f"{len(name)}s" + SOURCE.format.lstrip(">")
    return struct.Struct(layout), len(name), name


class JournaledStateStore:
    """The ``StateStore`` of one instance, journaled on the broker (see the module doc).

    The hot path encodes each update straight into the current input's record; structured
    copies of the updates are kept only once the function has read its state.
    """

    def __init__(
        self,
        client: pulsar.Client,
        fqfn: str,
        options: StateOptions,
        effectively_once: bool = False,
    ) -> None:
        self.journal_topic = journal_topic(fqfn, options.namespace)
        """Where the instance sends the journal messages ``drain`` returns."""
        self._client = client
        self._fqfn = fqfn
        self._options = options
        self._dedup = effectively_once
        self._writer_id = new_writer_id()
        self._seq = 0
        self._buf = bytearray()
        """The current input's updates, encoded."""
        self._count = 0
        self._records: list[bytes] = []
        """Records committed since the last ``drain``."""
        self._inflight: dict[Batch, list[bytes]] = {}
        """Before reads start: drained records whose sends have not settled yet."""
        self._heads: dict[str, tuple[struct.Struct, int, bytes]] = {}
        """Per input topic: how to pack a record's header, topic and source in one call."""
        # once reads have started (a table exists):
        self._table: StateTable | None = None
        self._current: list[Op] = []
        self._pending: dict[int, list[Op]] = {}
        """Committed records the table is not known to hold, by sequence number."""
        self._by_key: dict[bytes, deque[tuple[int, Op]]] = {}
        """The pending records' operations by key, in sequence order."""

    # --- StateStore -----------------------------------------------------------------------

    def incr(self, key: str, amount: int) -> None:
        if type(amount) is not int or not INT64_MIN <= amount <= INT64_MAX:
            check_amount(key, amount)  # raises, naming what is wrong
        self._append(INCR, key, amount, INT64.pack(amount))

    def put(self, key: str, value: bytes) -> None:
        value = check_value(key, bytes(value))
        self._append(PUT, key, value, U32.pack(len(value)) + value)

    def delete(self, key: str) -> None:
        self._append(DELETE, key, None, b"")

    def expect(self, key: str, value: bytes) -> None:
        """The updates after this one apply only if ``key`` holds ``value`` when the table
        applies them (they are seen at once here all the same)."""
        self._append(EXPECT, key, value, U32.pack(len(value)) + value)

    def get_counter(self, key: str) -> int:
        entry = self._read(state_key(key))
        if entry is None:
            return 0
        if not entry[0]:
            raise StateTypeError(
                f"state key {key!r} holds a value (put_state), not a counter: read it with "
                "get_state, or del_counter it before counting"
            )
        return int(entry[1])

    def get(self, key: str) -> bytes | None:
        entry = self._read(state_key(key))
        if entry is None:
            return None
        # a counter reads as its 8 big-endian bytes, as from BookKeeper's table service
        return INT64.pack(entry[1]) if entry[0] else bytes(entry[1])

    # --- the instance's side --------------------------------------------------------------

    def commit(self, topic: str, message_id: Any) -> None:
        """The current input was processed: its updates become one record."""
        if not self._count:
            return
        self._seq += 1
        head = self._heads.get(topic)
        if head is None:
            head = self._heads[topic] = _record_head(topic)
        self._records.append(
            head[0].pack(
                self._seq,
                head[1],
                self._count,
                head[2],
                message_id.ledger_id(),
                message_id.entry_id(),
                message_id.batch_index(),
            )
            + self._buf
        )
        self._buf = bytearray()
        self._count = 0
        if self._table is not None:
            self._index(self._seq, self._current)
            self._current = []

    def commit_unsourced(self) -> None:
        """The current updates came from no input (a timer's firing): they become one record
        without an input position, so EFFECTIVELY_ONCE's replay check leaves it alone."""
        if not self._count:
            return
        self._seq += 1
        self._records.append(RECORD_HEADER.pack(self._seq, 0, self._count) + self._buf)
        self._buf = bytearray()
        self._count = 0
        if self._table is not None:
            self._index(self._seq, self._current)
            self._current = []

    def commit_at(self, source_topic: str, source: tuple[int, int, int]) -> int:
        """The current updates become one record of ``source`` in ``source_topic`` (not an
        input: a timer's firing, see ``timer_once``), applied once like an input's under
        EFFECTIVELY_ONCE; its sequence number (0 when there was nothing to record)."""
        if not self._count:
            return 0
        self._seq += 1
        head = self._heads.get(source_topic)
        if head is None:
            head = self._heads[source_topic] = _record_head(source_topic)
        record = head[0].pack(self._seq, head[1], self._count, head[2], *source)
        self._records.append(record + self._buf)
        self._buf = bytearray()
        self._count = 0
        if self._table is not None:
            self._index(self._seq, self._current)
            self._current = []
        return self._seq

    @property
    def confirmed_seq(self) -> int:
        """The sequence number of this store's last record the table has applied (or
        skipped as applied before); 0 before reads start."""
        return self._table.confirmed_seq if self._table is not None else 0

    def open(self) -> None:
        """Materialize the table now rather than on the first read (timers fire without
        any input to read state for)."""
        if self._table is None:
            self._open_table()

    def scan(self, start: str, stop: str, limit: int) -> list[tuple[str, bytes | int]]:
        """Up to ``limit`` keys ``start`` <= key < ``stop`` of the table, in order, with
        their values (a counter's as an int). The instance's own updates the table does
        not hold yet are not in it: read a key found to see them."""
        table = self._table or self._open_table()
        return [
            (key.decode(), entry[1])
            for key, entry in table.scan(start.encode(), stop.encode(), limit)
        ]

    def rollback(self) -> None:
        """The current input failed: forget its updates (it will be processed again)."""
        self._buf = bytearray()
        self._count = 0
        self._current = []

    def drain(self) -> tuple[list[bytes], Batch | None]:
        """The journal messages of the records committed since the last drain, and the batch
        to ``settle`` once they are persisted (or failed)."""
        records = self._records
        if not records:
            return [], None
        self._records = []
        batch = (self._seq - len(records) + 1, self._seq)
        if self._table is None:
            self._inflight[batch] = records
        payloads: list[bytes] = []
        group: list[bytes] = []
        size = 0
        for record in records:
            if group and size + len(record) > _MESSAGE_BYTES:
                payloads.append(self._message(group))
                group, size = [], 0
            group.append(record)
            size += len(record)
        payloads.append(self._message(group))
        return payloads, batch

    def settle(self, batch: Batch, persisted: bool) -> None:
        """The journal messages of ``batch`` were persisted, or (``persisted`` False) may not
        have been: their inputs are redelivered and processed again."""
        if self._inflight.pop(batch, None) is not None or self._table is None:
            return  # nothing reads these records
        if persisted:
            self._prune(self._table.confirmed_seq)
            return
        first, last = batch
        keys: set[bytes] = set()
        for seq in range(first, last + 1):
            for op in self._pending.pop(seq, ()):
                keys.add(op[1])
        for key in keys:
            left = deque(item for item in self._by_key[key] if not first <= item[0] <= last)
            if left:
                self._by_key[key] = left
            else:
                del self._by_key[key]

    def close(self) -> None:
        """Stop the table (if reads started it); its checkpoint is written."""
        if self._table is not None:
            self._table.stop()
            self._table = None

    # --- internals ------------------------------------------------------------------------

    def _message(self, records: list[bytes]) -> bytes:
        return encode_message(self._writer_id, self._options.epoch, self._dedup, records)

    def _append(self, kind: int, key: str, arg: Any, encoded_arg: bytes) -> None:
        raw = key.encode() if type(key) is str else state_key(key)
        if not 0 < len(raw) <= MAX_KEY_BYTES:
            state_key(key)  # raises, naming what is wrong
        buf = self._buf
        mark = len(buf)
        buf += OP_HEADER.pack(kind, len(raw))
        buf += raw
        buf += encoded_arg
        if len(buf) > MAX_RECORD_BYTES:
            size = len(buf)
            del buf[mark:]
            raise StateTooLargeError(
                f"updating state key {key!r} would make this message's state updates "
                f"{size:,} bytes, more than the limit of {MAX_RECORD_BYTES:,} bytes (4 MiB)"
            )
        self._count += 1
        if self._table is not None:
            self._current.append((kind, raw, arg))

    def _index(self, seq: int, ops: list[Op]) -> None:
        self._pending[seq] = ops
        for op in ops:
            self._by_key.setdefault(op[1], deque()).append((seq, op))

    def _read(self, key: bytes) -> Entry | None:
        table = self._table or self._open_table()
        entry, confirmed = table.read(key)
        self._prune(confirmed)
        for _, (kind, _, arg) in self._by_key.get(key, ()):
            entry = apply_op(entry, kind, arg)
        for kind, op_key, arg in self._current:
            if op_key == key:
                entry = apply_op(entry, kind, arg)
        return entry

    def _prune(self, confirmed: int) -> None:
        """Forget the pending records the table holds now."""
        pending = self._pending
        while pending:
            seq = next(iter(pending))
            if seq > confirmed:
                return
            for op in pending.pop(seq):
                queue = self._by_key.get(op[1])
                if queue:
                    queue.popleft()
                    if not queue:
                        del self._by_key[op[1]]

    def _open_table(self) -> StateTable:
        """The first read: materialize the journal, then keep tailing it. The records still
        in flight, and the current input's updates, are indexed for reads from now on."""
        options = self._options
        log.info("%s reads its state: materializing %s", self._fqfn, self.journal_topic)
        table = StateTable(
            self._client,
            self.journal_topic,
            Path(options.directory),
            snapshot_topic=snapshot_topic(self._fqfn, options.namespace),
            own_writer=self._writer_id,
        ).start()
        try:
            table.catch_up(options.catch_up_timeout_s)
        except BaseException:
            table.stop()
            raise
        unsettled = [r for records in self._inflight.values() for r in records] + self._records
        for record in sorted(decode_records(unsettled), key=lambda r: r.seq):
            self._index(record.seq, record.ops)
        self._inflight.clear()
        current = RECORD_HEADER.pack(0, 0, self._count) + bytes(self._buf)
        self._current = decode_records([current])[0].ops
        self._table = table
        return table
