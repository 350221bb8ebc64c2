"""A consumer configuration set to send acknowledgements at once, in pulsar-client's own
C++ object (no broker)."""

from __future__ import annotations

import _pulsar
import pulsar

from magnetar.instance.acks_at_once import ack_grouping_ms, acking_at_once, acknowledge_at_once


def test_a_configuration_set_so_groups_no_acknowledgements() -> None:
    configuration = _pulsar.ConsumerConfiguration()
    assert ack_grouping_ms(configuration) == 100  # the client's default
    assert ack_grouping_ms(acknowledge_at_once(configuration)) == 0


def test_the_acking_client_is_a_copy_sharing_the_binding_and_its_consumers() -> None:
    client = pulsar.Client("pulsar://127.0.0.1:1")  # never connects: nothing is subscribed
    try:
        acking = acking_at_once(client)
        assert acking is not client
        assert acking._consumers is client._consumers
        assert acking._client.get_topic_partitions is not None  # the binding's, through it
    finally:
        client.close()
