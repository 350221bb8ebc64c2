"""State topic names: one journal per function, and state carried over from 0.1.0's names."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

from magnetar.statestore import StateTable, journal_topic, snapshot_topic
from magnetar.statestore.journal import unescaped_journal_topic
from magnetar.statestore.upgrade import carry_over_journals
from tests.statestore.conftest import Journal, incr

TIMEOUT = 30.0


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("public/default/a-b", "public/default-a/b"),
        ("a-b/c/d", "a/b-c/d"),
        ("t/ns/a=2Db", "t/ns/a-b"),  # the escape character is escaped too
        ("t/ns/x-", "t/ns-x/-"),
        ("t/ns/caf\u00e9", "t/ns/cafe"),
    ],
)
def test_no_two_functions_share_a_journal_or_snapshot_topic(one: str, other: str) -> None:
    assert journal_topic(one) != journal_topic(other)
    assert snapshot_topic(one) != snapshot_topic(other)


def test_names_are_escaped_into_valid_topic_names_and_plain_names_keep_theirs() -> None:
    assert journal_topic("public/default/a-b", "public/magnetar") == (
        "persistent://public/magnetar/state-public-default-a=2Db"
    )
    assert snapshot_topic("acme/prod/caf\u00e9 au lait", "public/magnetar") == (
        "persistent://public/magnetar/snapshots-acme-prod-caf=C3=A9=20au=20lait"
    )
    # a name of letters, digits, '_' and '.' keeps the journal 0.1.0 gave it
    assert journal_topic("public/default/word_count.v2") == unescaped_journal_topic(
        "public/default/word_count.v2"
    )


def _state(client: pulsar.Client, fqfn: str, directory: Path) -> dict[str, int | None]:
    table = StateTable(client, journal_topic(fqfn), directory).start()
    try:
        table.catch_up(TIMEOUT)
        entry = table.get("count")
        return {"count": entry.counter if entry else None}
    finally:
        table.stop()


def test_the_upgrade_carries_a_journal_over_once_unless_two_functions_shared_it(
    client: pulsar.Client, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    alone = f"up{run}/default/word-count"  # old journal: its own
    shared_a, shared_b = f"up{run}/x/a-b", f"up{run}/x-a/b"  # old journal: shared
    plain = f"up{run}/default/plain"  # name unchanged
    write: Callable[[str], Journal] = lambda topic: Journal(client, topic)  # noqa: E731
    old = write(unescaped_journal_topic(alone))
    for entry in range(3):
        old.send((entry, [incr("count", 10)]))
    write(unescaped_journal_topic(shared_a)).send((0, [incr("count", 5)]))
    write(journal_topic(plain)).send((0, [incr("count", 7)]))

    report = carry_over_journals(client, [alone, shared_a, shared_b, plain])
    assert report.copied == {alone: 3}
    assert report.ambiguous == {unescaped_journal_topic(shared_a): sorted([shared_a, shared_b])}
    assert _state(client, alone, tmp_path / "alone") == {"count": 30}
    assert _state(client, shared_a, tmp_path / "a") == {"count": None}
    assert _state(client, plain, tmp_path / "plain") == {"count": 7}

    again = carry_over_journals(client, [alone])  # run twice: nothing copied twice
    assert (again.copied, again.kept) == ({}, [alone])
    assert _state(client, alone, tmp_path / "alone-again") == {"count": 30}
