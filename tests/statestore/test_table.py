"""StateTable: a journal on the real broker materialized in real RocksDB directories."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

from magnetar.statestore import (
    StateEntry,
    StateQueryService,
    StateStoreError,
    StateTable,
    journal_topic,
)
from magnetar.statestore.records import DELETE, EXPECT, Op
from tests.statestore.conftest import Journal, OpenTable, incr, put

TIMEOUT = 20.0


def counter(value: int, version: int) -> StateEntry:
    return StateEntry(value, None, version)


def test_counters_values_and_deletes_are_applied_in_journal_order(
    open_table: OpenTable, journal: Callable[..., Journal]
) -> None:
    writer = journal()
    writer.send((1, [incr("a", 2), put("v", b"one")]), (2, [incr("a", -5)]))
    writer.send((3, [put("v", b"two"), incr("gone"), (DELETE, b"gone", None)]))
    table = open_table()
    table.catch_up(TIMEOUT)
    assert table.get("a") == counter(-3, 1)
    assert table.get("v") == StateEntry(None, b"two", 1)
    assert table.get("gone") is None
    assert table.get("never") is None


def test_a_restart_resumes_from_the_checkpoint(
    open_table: OpenTable, journal: Callable[..., Journal]
) -> None:
    writer = journal()
    writer.send((1, [incr("a")]), (2, [incr("a")]))
    first = open_table()
    first.catch_up(TIMEOUT)
    first.stop()
    writer.send((3, [incr("a", 10)]))
    again = open_table()
    again.catch_up(TIMEOUT)
    assert again.get("a") == counter(12, 2)
    assert again.applied_ops == 1  # only what was journaled after the checkpoint


def test_a_deleted_database_is_rebuilt_from_the_journal(
    open_table: OpenTable,
    journal: Callable[..., Journal],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal().send((1, [incr("a", 3), put("v", b"x")]))
    table = open_table(snapshot_topic=None)
    table.catch_up(TIMEOUT)
    table.stop()
    shutil.rmtree(tmp_path / "table")
    with caplog.at_level(logging.INFO, logger="magnetar.statestore.table"):
        rebuilt = open_table(snapshot_topic=None)
        rebuilt.catch_up(TIMEOUT)
    assert "no state database" in caplog.text
    assert rebuilt.get("a") == counter(3, 0)
    assert rebuilt.get("v") == StateEntry(None, b"x", 0)


def test_a_corrupt_database_is_logged_deleted_and_rebuilt(
    open_table: OpenTable,
    journal: Callable[..., Journal],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal().send((1, [incr("a", 3)]), (2, [incr("b", 4)]))
    table = open_table()
    table.catch_up(TIMEOUT)
    table.stop()
    (tmp_path / "table" / "CURRENT").write_text("not a manifest\n")
    with caplog.at_level(logging.WARNING, logger="magnetar.statestore.table"):
        rebuilt = open_table()
        rebuilt.catch_up(TIMEOUT)
    assert "is unusable" in caplog.text and "rebuilding" in caplog.text
    assert (rebuilt.get("a"), rebuilt.get("b")) == (counter(3, 0), counter(4, 0))


def test_a_database_in_use_is_not_touched(
    open_table: OpenTable, journal: Callable[..., Journal]
) -> None:
    journal().send((1, [incr("a")]))
    table = open_table()
    table.catch_up(TIMEOUT)
    with pytest.raises(StateStoreError, match="in use by another process"):
        open_table()
    assert table.get("a") == counter(1, 0)


def test_effectively_once_records_apply_once_per_input_position(
    open_table: OpenTable, journal: Callable[..., Journal]
) -> None:
    once = journal(dedup=True)
    once.send((1, [incr("eo")]), (2, [incr("eo")]), (3, [incr("eo")]))
    # inputs 2 and 3 processed again after a crash, then a new input 4
    once.send((2, [incr("eo")]), (3, [incr("eo")]), (4, [incr("eo")]))
    once.send((3, [incr("eo")]), topic="persistent://public/default/other")
    at_least = journal(dedup=False)
    at_least.send((1, [incr("alo")]), (1, [incr("alo")]))
    table = open_table()
    table.catch_up(TIMEOUT)
    assert table.get("eo").counter == 5  # type: ignore[union-attr]
    assert table.get("alo").counter == 2  # type: ignore[union-attr]


def test_a_timer_firing_applies_once_and_only_while_its_timer_is_pending(
    open_table: OpenTable, journal: Callable[..., Journal]
) -> None:
    """A firing's record (see ``timer_once``): the lane's count, then a guard on the timer,
    then the callback's changes; tagged with its lane and number."""
    writer = journal(dedup=True)
    writer.send((1, [put("timer", b"armed-1")]))

    def firing(number: int, armed: bytes, output: str) -> tuple[int, list[Op]]:
        guarded = [incr("fired"), put("timer", b"gone"), put("outbox", output.encode())]
        return (number, [incr("count"), (EXPECT, b"timer", armed), *guarded])

    lane = "timers:0"
    writer.send(firing(1, b"armed-1", "first"), topic=lane)
    writer.send(firing(1, b"armed-1", "again"), topic=lane)  # fired again: the same number
    writer.send(firing(2, b"armed-1", "other owner"), topic="timers:1")  # timer gone by now
    writer.send((2, [put("timer", b"armed-2")]))  # armed again
    writer.send(firing(2, b"armed-2", "second"), topic=lane)
    table = open_table()
    table.catch_up(TIMEOUT)
    assert table.get("fired") == counter(2, 1)
    assert table.get("outbox") == StateEntry(None, b"second", 1)
    assert table.get("count") == counter(3, 2)  # each new number counts, guarded or not


def test_deleting_the_state_drops_it_and_late_records_of_the_deleted_function(
    client: pulsar.Client,
    fqfn: str,
    tmp_path: Path,
    open_table: OpenTable,
    journal: Callable[..., Journal],
) -> None:
    old = journal(epoch=2)
    old.send((1, [incr("a", 5), put("v", b"x")]))
    queries = StateQueryService(client, tmp_path / "queries")
    try:
        assert queries.get(fqfn, "a") == counter(5, 0)
        queries.delete_state(fqfn, epoch=3)  # the function was deleted at version 3
        assert queries.get(fqfn, "a") is None
        assert queries.get(fqfn, "v") is None
        old.send((2, [incr("a", 100)]))  # an instance of the deleted function, still draining
        new = journal(epoch=4)
        new.send((1, [incr("a", 1)]))
        assert queries.get(fqfn, "a") == counter(1, 0)
    finally:
        queries.stop()
    replayed = open_table()
    replayed.catch_up(TIMEOUT)
    assert replayed.get("a") == counter(1, 0)


def test_a_new_table_starts_from_the_latest_snapshot(
    open_table: OpenTable, journal: Callable[..., Journal], caplog: pytest.LogCaptureFixture
) -> None:
    writer = journal(dedup=True)
    for entry in range(1, 51):
        writer.send((entry, [incr(f"k{entry % 5}"), put("last", str(entry).encode())]))
    table = open_table("first")
    table.catch_up(TIMEOUT)
    table.publish_snapshot()
    writer.send((51, [incr("k1", 10)]), (50, [incr("k1", 1000)]))  # the second is a replay
    with caplog.at_level(logging.INFO, logger="magnetar.statestore.table"):
        fresh = open_table("fresh")
        fresh.catch_up(TIMEOUT)
    assert "from a snapshot (6 keys)" in caplog.text
    assert fresh.applied_ops == 1  # the snapshot holds the rest; the replay is still skipped
    assert fresh.get("k1").counter == 20  # type: ignore[union-attr]
    assert fresh.get("k0").counter == 10  # type: ignore[union-attr]
    assert fresh.get("last") == StateEntry(None, b"50", 49)


def test_a_database_built_from_another_journal_is_rebuilt(
    client: pulsar.Client,
    open_table: OpenTable,
    journal: Callable[..., Journal],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a database built from another journal (say, on another broker) under this function's name
    other = journal(topic=f"{journal_topic('public/default/x')}-other-{tmp_path.name}")
    for entry in range(20):
        other.send((entry, [incr("a", 100)]))
    stale = StateTable(client, other.producer.topic(), tmp_path / "table").start()
    stale.catch_up(TIMEOUT)
    stale.stop()
    journal().send((1, [incr("a", 1)]))
    with caplog.at_level(logging.WARNING, logger="magnetar.statestore.table"):
        table = open_table()
        table.catch_up(TIMEOUT)
    assert "was built from another journal" in caplog.text
    assert table.get("a") == counter(1, 0)


def test_a_malformed_journal_message_is_skipped(
    client: pulsar.Client,
    fqfn: str,
    open_table: OpenTable,
    journal: Callable[..., Journal],
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = client.create_producer(journal_topic(fqfn), batching_enabled=False)
    producer.send(b"not a journal message")
    producer.close()
    journal().send((1, [incr("a", 2)]))
    with caplog.at_level(logging.WARNING, logger="magnetar.statestore.table"):
        table = open_table()
        table.catch_up(TIMEOUT)
    assert "skipping message" in caplog.text
    assert table.get("a") == counter(2, 0)


FORKED_TABLES = """
import os, sys
from pathlib import Path

import pulsar  # before the forks, as in the workers' fork server

url, topic, root = sys.argv[1:4]
children = []
for index in range(3):
    pid = os.fork()
    if pid == 0:
        from magnetar.statestore import StateTable

        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        table = StateTable(client, topic, Path(root) / str(index)).start()
        try:
            table.catch_up(10)
            entry = table.get("a")
            said = f"{index} {None if entry is None else entry.counter}"
        except Exception as error:
            said = f"{index} {error!r}"
        os.write(1, f"{said}\\n".encode())  # one write: the three children share the pipe
        table.stop()
        client.close()
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


def test_tables_in_processes_forked_after_the_client_was_loaded_each_apply_the_whole_journal(
    broker_url: str, fqfn: str, journal: Callable[..., Journal], tmp_path: Path
) -> None:
    """Instances are forked from one process, so the client library's random reader names
    were the same in each: on pulsar-lite their state tables shared a subscription and each
    missed what the others read (a timer armed before a rescale never fired)."""
    writer = journal()
    for entry in range(5):
        writer.send((entry, [incr("a")]))
    forked = subprocess.run(
        [sys.executable, "-c", FORKED_TABLES, broker_url, journal_topic(fqfn), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sorted(forked.stdout.splitlines()) == ["0 5", "1 5", "2 5"], forked.stderr
