"""The instance's sends through pulsar-client's C API (``native_sends``, the extension make
builds): a consumer sees exactly what pulsar-client's own ``send_async`` would have sent, the
callback is told how each send ended, and whatever the native path does not take is sent by
pulsar-client, through the instance's ``ChunkSender`` as before."""

from __future__ import annotations

import shutil
import threading
import time
from datetime import timedelta
from typing import Any

import pulsar
import pytest
from pulsar.schema import BytesSchema, StringSchema

from magnetar.instance import native_sends
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.native_sends import native_sender
from tests.integration.conftest import collect

pytestmark = pytest.mark.brokers("lite", "apache")

_FIELDS: dict[str, Any] = {
    "properties": {"__pfn_input_topic__": "persistent://public/default/in", "k": "v é"},
    "event_timestamp": 1_700_000_000_123,
    "sequence_id": 41,
    "partition_key": "key-1",
    "ordering_key": "order-1",
}


@pytest.fixture
def sender_class() -> Any:
    if native_sends.Sender is None:
        pytest.skip("make built no native sends here (no C compiler)")
    return native_sends.Sender


def _seen(message: Any) -> tuple[Any, ...]:
    return (
        message.data(),
        message.properties(),
        message.event_timestamp(),
        message.partition_key(),
        message.ordering_key(),
    )


def test_make_built_the_native_sends() -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here: make builds no native sends")
    assert native_sends.Sender is not None


def test_a_native_send_is_what_pulsar_clients_send_would_have_been(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    producer = client.create_producer(topic, batching_enabled=True)
    results: list[tuple[Any, Any]] = []
    done = threading.Event()

    def on_sent(result: Any, message_id: Any) -> None:
        results.append((result, message_id))
        done.set()

    sender = sender_class(producer)
    assert sender.send_async(b"native", on_sent, **_FIELDS) is None
    producer.send_async(b"native", None, **_FIELDS)
    producer.flush()
    assert done.wait(10)
    assert results == [(pulsar.Result.Ok, None)]

    native, python = collect(client, topic, 2)
    assert _seen(native) == _seen(python)
    assert _seen(native) == (
        b"native",
        _FIELDS["properties"],
        1_700_000_000_123,
        "key-1",
        "order-1",
    )
    producer.close()


def test_a_native_flush_sends_the_open_batch_without_waiting_for_its_delay(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=60_000
    )
    consumer = client.subscribe(topic, "check")
    sender = sender_class(producer)
    sender.send_async(b"now", None)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)  # held for its minute
    sender.flush_async()
    assert consumer.receive(5_000).data() == b"now"
    consumer.close()
    producer.close()


def test_a_send_on_a_closed_producer_reports_its_failure(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    producer = client.create_producer(topic)
    sender = sender_class(producer)
    producer.close()
    results: list[Any] = []
    done = threading.Event()
    sender.send_async(b"late", lambda result, _: (results.append(result), done.set()))
    assert done.wait(10)
    assert results == [pulsar.Result.AlreadyClosed]


def test_a_recorded_send_is_in_the_ledger_with_its_token_once_persisted(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    producer = client.create_producer(topic, batching_enabled=True)
    sender, ledger = sender_class(producer), native_sends.Ledger()
    assert ledger is not None
    for n in range(3):
        assert sender.send_recorded(f"m{n}".encode(), ledger, ("token", n), **_FIELDS) is None
    sender.flush_async()
    recorded: list[Any] = []
    while len(recorded) < 3 and ledger.wait(10):
        recorded += ledger.take()
    assert recorded == [(("token", n), pulsar.Result.Ok) for n in range(3)]
    assert [m.data() for m in collect(client, topic, 3)] == [b"m0", b"m1", b"m2"]
    producer.close()
    sender.send_recorded(b"late", ledger, "after close")
    assert ledger.wait(10)
    assert ledger.take() == [("after close", pulsar.Result.AlreadyClosed)]
    assert ledger.wait(0.01) is False  # nothing more, and no wake-up left behind


def test_a_recorded_send_the_native_path_does_not_take_records_nothing(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    producer = client.create_producer(topic)
    sender, ledger = sender_class(producer), native_sends.Ledger()
    assert sender.send_recorded("text", ledger, "token") is NotImplemented
    with pytest.raises(TypeError, match="send_recorded"):
        sender.send_recorded(b"x", "not a ledger", "token")
    assert not ledger.wait(0.2)
    assert ledger.take() == []
    producer.close()


def test_a_ledger_wait_ends_when_notified(sender_class: Any) -> None:
    ledger = native_sends.Ledger()
    assert ledger is not None
    threading.Timer(0.1, ledger.notify).start()
    assert ledger.wait(10) is True
    assert ledger.take() == []


@pytest.mark.parametrize(
    ("content", "fields"),
    [
        (bytearray(b"x"), {}),
        ("text", {}),
        (b"x", {"deliver_after": timedelta(seconds=1)}),
        (b"x", {"properties": {"k": "with\0nul"}}),
        (b"x", {"properties": {"k": 1}}),
        (b"x", {"sequence_id": -1}),
        (b"x", {"event_timestamp": 1.5}),
        (b"x", {"partition_key": b"bytes"}),
    ],
    ids=[
        "bytearray",
        "str",
        "deliver_after",
        "nul-in-property",
        "int-property",
        "negative-sequence-id",
        "float-timestamp",
        "bytes-key",
    ],
)
def test_what_the_native_path_does_not_take_it_leaves_unsent(
    client: pulsar.Client, topic: str, sender_class: Any, content: Any, fields: dict[str, Any]
) -> None:
    producer = client.create_producer(topic)
    sender = sender_class(producer)
    assert sender.send_async(content, None, **fields) is NotImplemented
    producer.send_async(b"only", None)
    producer.flush()
    assert [m.data() for m in collect(client, topic, 1)] == [b"only"]
    producer.close()


@pytest.mark.parametrize("built", [True, False], ids=["built", "not-built"])
def test_the_chunk_sender_hands_what_is_not_native_to_pulsar_client(
    client: pulsar.Client, topic: str, built: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not built:
        monkeypatch.setattr(native_sends, "Sender", None)
        monkeypatch.setattr(native_sends, "Ledger", None)
    producer = client.create_producer(topic, batching_enabled=True)
    sender = ChunkSender(large_message_bytes=1 << 20)
    chunk = Chunk()
    sender.send(chunk, producer, b"a", {"properties": {"n": "1"}})
    sender.send(chunk, producer, b"b", {"properties": {"n": "2\0two"}})
    sender.send(chunk, producer, b"c", {"disable_replication": True})
    sender.seal(chunk)
    sender.flush()
    deadline = time.monotonic() + 10
    while not sender.collect() and time.monotonic() < deadline:
        sender.wait_completed(1)
    assert list(sender.collect()) == [(chunk, pulsar.Result.Ok, None)]
    sender.close()

    received = collect(client, topic, 3)
    assert [(m.data(), m.properties()) for m in received] == [
        (b"a", {"n": "1"}),
        (b"b", {"n": "2\0two"}),
        (b"c", {}),
    ]
    producer.close()


def test_a_producer_whose_schema_encodes_is_not_sent_natively(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    assert native_sender(client.create_producer(topic, schema=StringSchema())) is None
    assert isinstance(native_sender(client.create_producer(topic + "-bytes")), sender_class)


def test_a_binding_that_hands_out_no_producer_is_sent_through_pulsar_client(
    sender_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class OlderClientProducer:  # a binding without pybind11's conduit
        _schema = BytesSchema()
        _producer = object()

    native_sends._declined.cache_clear()  # warned once a reason
    assert native_sender(OlderClientProducer()) is None
    assert "instances send through pulsar-client's Python producer" in caplog.text


def test_the_chunk_sender_settles_native_chunks_through_the_ledger(
    client: pulsar.Client, topic: str, sender_class: Any
) -> None:
    producer = client.create_producer(topic, batching_enabled=True)
    sender = ChunkSender(large_message_bytes=1 << 20)
    sent, failed = Chunk(), Chunk()
    for value in (b"a", b"b", b"c"):
        sender.send(sent, producer, value, {})
    sender.seal(sent)
    sender.flush()
    deadline = time.monotonic() + 10
    while not sender.collect() and time.monotonic() < deadline:
        sender.wait_completed(1)
    assert list(sender.collect()) == [(sent, pulsar.Result.Ok, None)]
    assert [m.data() for m in collect(client, topic, 3)] == [b"a", b"b", b"c"]
    sender.collect().clear()
    producer.close()
    sender.send(failed, producer, b"late", {})
    sender.seal(failed)
    while not sender.collect() and time.monotonic() < deadline:
        sender.wait_completed(1)
    assert list(sender.collect()) == [(failed, pulsar.Result.AlreadyClosed, None)]
    sender.close()
