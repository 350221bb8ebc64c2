"""``StateQueryService``: a worker's answers to state queries, from tables it keeps caught up.

The first query of a function opens a table of the worker's own (a RocksDB database under
the worker's data directory) and the table then keeps tailing the journal, so a later query
only waits for what was journaled since: it asks the broker for the journal's end and waits
until the table has applied it. Puts go to the journal like an instance's updates and return
once this worker's table has applied them (read-your-writes). The query tables also publish
snapshots of the state, so new tables need not replay a journal from its start.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from urllib.parse import quote, unquote

import pulsar

from magnetar.statestore.exceptions import StateJournalError
from magnetar.statestore.journal import (
    DEFAULT_NAMESPACE,
    JournalWriter,
    journal_topic,
    snapshot_topic,
)
from magnetar.statestore.records import (
    CLEAR,
    DELETE,
    INCR,
    PUT,
    Op,
    StateEntry,
    check_amount,
    check_value,
    state_key,
)
from magnetar.statestore.table import StateTable

__all__ = ["SNAPSHOT_EVERY_OPS", "StateQueryService", "instance_state_dir"]

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_OPS = 100_000
"""A query table publishes a snapshot after applying this many updates since the last."""


def _directory_name(fqfn: str) -> str:
    return quote(fqfn, safe="")  # one path component, whatever the names hold


def instance_state_dir(root: Path, fqfn: str, instance_id: int) -> Path:
    """The RocksDB directory of one instance of ``fqfn`` under a state root."""
    return root / "instances" / _directory_name(fqfn) / str(instance_id)


class StateQueryService:
    """Caught-up state tables of the functions queried on this worker."""

    def __init__(
        self,
        client: pulsar.Client,
        root: Path,
        namespace: str = DEFAULT_NAMESPACE,
        timeout_s: float = 10.0,
        snapshot_every: int = SNAPSHOT_EVERY_OPS,
    ) -> None:
        self.root = root
        self._client = client
        self._namespace = namespace
        self._timeout_s = timeout_s
        self._snapshot_every = snapshot_every
        self._tables: dict[str, StateTable] = {}
        self._writers: dict[str, JournalWriter] = {}
        self._lock = threading.Lock()

    def get(self, fqfn: str, key: str) -> StateEntry | None:
        """``key``'s state once everything journaled before the call is applied."""
        table = self._table(fqfn)
        table.catch_up(self._timeout_s)
        return table.get(key)

    def scan(self, fqfn: str, start: str, stop: str, limit: int) -> list[tuple[str, StateEntry]]:
        """Up to ``limit`` keys ``start`` <= key < ``stop`` in order, with their state, once
        everything journaled before the call is applied."""
        table = self._table(fqfn)
        table.catch_up(self._timeout_s)
        return [
            (key.decode(), StateEntry.of(entry))
            for key, entry in table.scan(start.encode(), stop.encode(), limit)
        ]

    def put(
        self,
        fqfn: str,
        key: str,
        epoch: int,
        value: bytes | None = None,
        counter: int | None = None,
    ) -> None:
        """Store ``value`` under ``key`` (or set its counter to ``counter``); returns once
        this worker's table holds it."""
        raw = state_key(key)
        if value is not None:
            ops: list[Op] = [(PUT, raw, check_value(key, value))]
        else:
            # a counter is set as one record: remove the key, then count up from zero
            ops = [(DELETE, raw, None), (INCR, raw, check_amount(key, counter))]
        self._write(fqfn, ops, epoch)

    def delete_state(self, fqfn: str, epoch: int) -> None:
        """Delete every key of ``fqfn`` (its function was deleted at version ``epoch``):
        records still coming from instances of older versions are ignored."""
        self._write(fqfn, [(CLEAR, b"", None)], epoch)

    def forget(self, existing: set[str]) -> None:
        """Drop the tables and directories of functions not in ``existing`` (deleted)."""
        with self._lock:
            for fqfn in list(self._tables):
                if fqfn not in existing:
                    self._tables.pop(fqfn).stop()
                    writer = self._writers.pop(fqfn, None)
                    if writer is not None:
                        writer.close()
            for kind in ("query", "instances"):
                parent = self.root / kind
                if not parent.is_dir():
                    continue
                for path in parent.iterdir():
                    if unquote(path.name) not in existing:
                        log.info("removing the local state of deleted function %s", path.name)
                        shutil.rmtree(path, ignore_errors=True)

    def stop(self) -> None:
        """Stop every table (their checkpoints are written)."""
        with self._lock:
            for table in self._tables.values():
                table.stop()
            for writer in self._writers.values():
                writer.close()
            self._tables.clear()
            self._writers.clear()

    def _write(self, fqfn: str, ops: list[Op], epoch: int) -> None:
        table = self._table(fqfn)
        with self._lock:
            writer = self._writers.get(fqfn)
            if writer is None:
                writer = self._writers[fqfn] = JournalWriter(
                    self._client, journal_topic(fqfn, self._namespace), self._timeout_s
                )
        message_id = writer.write(ops, epoch)
        if not table.wait_applied(message_id, self._timeout_s):
            raise StateJournalError(
                f"the state update of {fqfn} was journaled but not applied here within "
                f"{self._timeout_s:.0f} s"
            )

    def _table(self, fqfn: str) -> StateTable:
        with self._lock:
            table = self._tables.get(fqfn)
            if table is None:
                table = StateTable(
                    self._client,
                    journal_topic(fqfn, self._namespace),
                    self.root / "query" / _directory_name(fqfn),
                    snapshot_topic=snapshot_topic(fqfn, self._namespace),
                    snapshot_every=self._snapshot_every,
                    name=fqfn,
                ).start()
                self._tables[fqfn] = table
            return table
