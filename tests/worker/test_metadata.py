"""The metadata topic as a replicated state machine: replay rules, fencing, writes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pulsar
import pytest

from magnetar.positions import more_in_batch
from magnetar.tailer import TopicTailer
from magnetar.worker.exceptions import FunctionExistsError
from magnetar.worker.metadata import FunctionRecord, MetadataManager


def record(fqfn: str, **fields: object) -> bytes:
    return json.dumps(FunctionRecord(fqfn, {"inputs": ["x"], **fields}, None).to_json()).encode()


def concurrently(write: Callable[[], object], times: int = 4) -> list[str]:
    """Run ``write`` on ``times`` threads at once: "created" or "conflict" for each."""
    outcomes: list[str] = []

    def attempt() -> None:
        try:
            write()
            outcomes.append("created")
        except FunctionExistsError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=attempt) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def send(producer: pulsar.Producer, value: bytes, **properties: str) -> None:
    producer.send(value, properties=properties)


@pytest.fixture
def metadata_topic(topic: str) -> str:
    return f"persistent://public/default/{topic}-metadata"


def replay(client: pulsar.Client, topic: str) -> MetadataManager:
    manager = MetadataManager(client, topic)
    manager.start()
    assert manager.wait_caught_up(10)
    return manager


def test_replay_applies_versions_in_order_and_tombstones(
    client: pulsar.Client, metadata_topic: str
) -> None:
    producer = client.create_producer(metadata_topic, batching_enabled=False)
    send(producer, b"", type="__term__", term="1", leader="w1")
    send(
        producer,
        record("t/n/a", parallelism=1),
        type="function",
        fqfn="t/n/a",
        term="1",
        leader="w1",
        version="1",
    )
    send(
        producer,
        record("t/n/a", parallelism=2),
        type="function",
        fqfn="t/n/a",
        term="1",
        leader="w1",
        version="2",
    )
    send(
        producer,
        record("t/n/a", parallelism=9),
        type="function",
        fqfn="t/n/a",
        term="1",
        leader="w1",
        version="2",
    )  # a stale version: ignored
    send(
        producer, record("t/n/b"), type="function", fqfn="t/n/b", term="1", leader="w1", version="1"
    )
    send(producer, b"", type="function", fqfn="t/n/b", term="1", leader="w1", version="2")
    manager = replay(client, metadata_topic)
    try:
        assert sorted(manager.functions()) == ["t/n/a"]
        assert manager.get("t/n/a").config["parallelism"] == 2  # type: ignore[union-attr]
        assert manager.version_of("t/n/b") == 2  # deleted, its version remembered
        assert manager.term_owner() == (1, "w1")
    finally:
        manager.stop()


def test_records_of_a_deposed_or_rival_leader_are_ignored(
    client: pulsar.Client, metadata_topic: str
) -> None:
    producer = client.create_producer(metadata_topic, batching_enabled=False)
    send(producer, b"", type="__term__", term="1", leader="old")
    send(producer, b"", type="__term__", term="2", leader="new")
    send(producer, b"", type="__term__", term="2", leader="rival")  # same term, too late
    send(
        producer,
        record("t/n/f"),
        type="function",
        fqfn="t/n/f",
        term="1",
        leader="old",
        version="1",
    )
    send(
        producer,
        record("t/n/g"),
        type="function",
        fqfn="t/n/g",
        term="2",
        leader="rival",
        version="1",
    )
    send(
        producer,
        record("t/n/h"),
        type="function",
        fqfn="t/n/h",
        term="2",
        leader="new",
        version="1",
    )
    manager = replay(client, metadata_topic)
    try:
        assert sorted(manager.functions()) == ["t/n/h"]
        assert manager.term_owner() == (2, "new")
    finally:
        manager.stop()


def test_leader_writes_are_serialized_and_read_back(
    client: pulsar.Client, metadata_topic: str
) -> None:
    manager = replay(client, metadata_topic)
    try:
        assert manager.mark_term(1, "me", 10)

        def create(current: FunctionRecord | None) -> FunctionRecord:
            if current is not None:
                raise FunctionExistsError("exists")
            return FunctionRecord("t/n/once", {"inputs": ["x"]}, None)

        outcomes = concurrently(lambda: manager.write(1, "me", "t/n/once", create, 10))
        assert sorted(outcomes) == ["conflict", "conflict", "conflict", "created"]
        applied = manager.get("t/n/once")
        assert applied is not None and applied.version == 1 and applied.config_version == 1
        # A second replica sees the same state.
        replica = replay(client, metadata_topic)
        try:
            assert replica.functions() == manager.functions()
        finally:
            replica.stop()
    finally:
        manager.stop()


def test_tailer_catches_up_on_an_empty_topic_and_after_writes(
    client: pulsar.Client, metadata_topic: str
) -> None:
    seen: list[bytes] = []
    tailer = TopicTailer(client, metadata_topic, lambda m: seen.append(m.data()), "test")
    tailer.start()
    try:
        assert tailer.wait_caught_up(10)
        producer = client.create_producer(metadata_topic, batching_enabled=False)
        ids = [producer.send(f"r{i}".encode()) for i in range(50)]
        assert tailer.wait_applied(ids[-1], 10)
        assert tailer.catch_up(10)
        assert seen == [f"r{i}".encode() for i in range(50)]  # each once, in order
    finally:
        tailer.stop()


def test_catch_up_is_not_fooled_by_a_message_read_but_not_yet_applied(
    client: pulsar.Client, metadata_topic: str
) -> None:
    """The race a state query on a restarted worker lost (it answered 6 updates short): the
    tailing reader's client had handed over the last message, so that reader said nothing
    more was available, while the tailer had not applied it yet."""
    client.create_producer(metadata_topic).send(b"r0")
    tailer = TopicTailer(client, metadata_topic, lambda m: None, "test")
    # the tailer's reader, without its thread: the message is taken, never applied
    tailer._reader = client.create_reader(metadata_topic, pulsar.MessageId.earliest)
    try:
        assert tailer._reader.read_next(10_000).data() == b"r0"
        assert not tailer._reader.has_message_available()  # what catch-up used to trust
        assert not tailer.catch_up(1.0)
    finally:
        tailer.stop()


def test_a_message_id_tells_whether_more_of_its_batch_follows(
    client: pulsar.Client, metadata_topic: str
) -> None:
    """What a tailer's catch-up relies on after starting from a checkpoint inside a batch:
    pulsar-lite names the last entry, not message, as a topic's last, so a reader created
    there says nothing more is available until the batch's rest arrives."""
    batched = client.create_producer(
        metadata_topic,
        batching_enabled=True,
        batching_max_messages=10,
        batching_max_publish_delay_ms=1000,
    )
    for i in range(10):
        batched.send_async(f"r{i}".encode(), None)
    batched.flush()
    client.create_producer(metadata_topic).send(b"alone")
    reader = client.create_reader(metadata_topic, pulsar.MessageId.earliest)
    ids = [reader.read_next(10_000).message_id() for _ in range(11)]
    reader.close()

    assert [more_in_batch(i) for i in ids] == [True] * 9 + [False, False]
    checkpoint = pulsar.MessageId.deserialize(ids[4].serialize())  # as a table keeps it
    assert more_in_batch(checkpoint) is True


def test_entries_start_from_the_defaults_and_follow_records(
    client: pulsar.Client, metadata_topic: str
) -> None:
    defaults = {"tenant": {"public": {"allowedClusters": ["standalone"]}}}
    producer = client.create_producer(metadata_topic, batching_enabled=False)
    send(producer, b"", type="__term__", term="1", leader="w1")
    send(
        producer,
        b'{"allowedClusters": ["c"]}',
        type="tenant",
        key="acme",
        term="1",
        leader="w1",
        version="1",
    )
    send(producer, b"", type="tenant", key="public", term="1", leader="w1", version="1")
    send(producer, b'{"x": 1}', type="namespace", key="acme/a", term="1", leader="w1", version="1")
    manager = MetadataManager(client, metadata_topic, entries=defaults)
    manager.start()
    try:
        assert manager.wait_caught_up(10)
        assert manager.entries("tenant") == {"acme": {"allowedClusters": ["c"]}}
        assert manager.entries("namespace") == {"acme/a": {"x": 1}}
        assert manager.functions() == {}  # entries are no functions
        assert manager.version_of(MetadataManager.entry_key("tenant", "public")) == 1
    finally:
        manager.stop()


def test_an_entry_write_is_decided_while_writes_are_serialized(
    client: pulsar.Client, metadata_topic: str
) -> None:
    manager = replay(client, metadata_topic)
    try:
        assert manager.mark_term(1, "me", 10)

        def create(current: dict[str, object] | None) -> dict[str, object]:
            if current is not None:
                raise FunctionExistsError("exists")
            return {"made": True}

        outcomes = concurrently(lambda: manager.write_entry(1, "me", "tenant", "once", create, 10))
        assert sorted(outcomes) == ["conflict", "conflict", "conflict", "created"]
        assert manager.write_entry(1, "me", "tenant", "once", lambda current: None, 10) is None
        replica = replay(client, metadata_topic)
        try:
            assert replica.entries("tenant") == {}
            assert replica.version_of(MetadataManager.entry_key("tenant", "once")) == 2
        finally:
            replica.stop()
    finally:
        manager.stop()
