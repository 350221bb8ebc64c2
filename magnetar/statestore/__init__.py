"""Function state: counters and values, journaled on the broker, materialized in RocksDB.

Each function has a table of signed 64-bit counters and byte values. Its durable form is a
journal topic on the broker (``state-<tenant>-<namespace>-<name>`` in the system namespace, each
part escaped so that no two functions share it):
an instance turns the state updates of one input message into one journal record, sent
before the input is acknowledged and carrying the input's topic and position. Whoever needs
the table (an instance that reads its state, a worker answering state queries) materializes
it into a RocksDB database of its own, with the journal position in the same write batch, so
a restart resumes from its checkpoint and a lost or corrupt database is rebuilt from the
latest snapshot and the journal.

* ``records``: the journal's binary format and the limits on keys and values.
* ``table``: ``StateTable``, a journal replayed into RocksDB (and its rules: counters add,
  puts replace, EFFECTIVELY_ONCE records apply once per input position).
* ``journal``: topic names and the producer side.
* ``snapshots``: publishing and loading snapshots of a table.
* ``instance_store``: ``JournaledStateStore``, what a function's Context uses.
* ``queries``: ``StateQueryService``, a worker's caught-up tables for REST queries.
* ``upgrade``: carrying journals over from Magnetar 0.1.0's unescaped names.
"""

from magnetar.statestore.exceptions import (
    InvalidStateUpdateError,
    StateJournalError,
    StateStoreError,
    StateTooLargeError,
    StateTypeError,
)
from magnetar.statestore.instance_store import JournaledStateStore, StateOptions
from magnetar.statestore.journal import journal_topic, snapshot_topic
from magnetar.statestore.queries import StateQueryService, instance_state_dir
from magnetar.statestore.records import (
    CLEAR,
    DELETE,
    EXPECT,
    INCR,
    MAX_KEY_BYTES,
    MAX_RECORD_BYTES,
    MAX_VALUE_BYTES,
    PUT,
    JournalMessage,
    StateEntry,
    decode_message,
)
from magnetar.statestore.table import StateTable

__all__ = [
    "CLEAR",
    "DELETE",
    "EXPECT",
    "INCR",
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_VALUE_BYTES",
    "PUT",
    "InvalidStateUpdateError",
    "JournalMessage",
    "JournaledStateStore",
    "StateEntry",
    "StateJournalError",
    "StateOptions",
    "StateQueryService",
    "StateStoreError",
    "StateTable",
    "StateTooLargeError",
    "StateTypeError",
    "decode_message",
    "instance_state_dir",
    "journal_topic",
    "snapshot_topic",
]
