"""The read loop of one range: the ids it hands over are the client's own, message by message."""

from __future__ import annotations

import pulsar
import pytest

from magnetar.spark_connector._client import shared_client
from magnetar.spark_connector._offsets import BEFORE_EARLIEST, position_of
from magnetar.spark_connector._ranges import RangePartition, ReadSettings, read_range
from tests.spark.conftest import full

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("batch", [0, 5, 300], ids=["unbatched", "batches-of-5", "batches-of-300"])
def test_ids_are_the_clients_serialized_ids(
    client: pulsar.Client, broker_url: str, topic: str, batch: int
) -> None:
    """The loop predicts most ids from the one before in its batch (batch indexes of one and
    two bytes here) rather than asking each for its position: the result must be what the
    client's ``serialize()`` gives, each message once, in order."""
    producer = client.create_producer(
        topic,
        batching_enabled=batch > 0,
        batching_max_messages=max(batch, 2),
        batching_max_publish_delay_ms=1000,
        block_if_queue_full=True,
    )
    for index in range(900):
        producer.send_async(f"m{index}".encode(), None)
    producer.flush()
    producer.close()

    part = RangePartition(full(topic), BEFORE_EARLIEST, None)
    settings = ReadSettings(service_url=broker_url)
    chunks = list(read_range(shared_client(broker_url, {}), part, settings, chunk_rows=128))

    ids = [serialized for chunk in chunks for serialized in chunk.ids]
    assert ids == _read_plainly(client, full(topic), 900)
    assert [bytes(m.data()) for chunk in chunks for m in chunk.messages] == [
        f"m{index}".encode() for index in range(900)
    ]


def _read_plainly(client: pulsar.Client, topic: str, count: int) -> list[bytes]:
    """``serialize()`` of every message id, asked of each id, redeliveries skipped."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    ids: list[bytes] = []
    last = BEFORE_EARLIEST
    try:
        while len(ids) < count:
            message_id = reader.read_next(10_000).message_id()
            if position_of(message_id) > last:
                last = position_of(message_id)
                ids.append(message_id.serialize())
    finally:
        reader.close()
    return ids
