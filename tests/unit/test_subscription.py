"""Consumer names (on an ordered, Failover, subscription the newest consumer sorts first), and
how many messages a consumer prefetches."""

from __future__ import annotations

import logging
import time

import pytest

from magnetar.instance import FunctionConfig, InstanceOptions
from magnetar.instance.config import ConsumerSpec
from magnetar.instance.subscription import (
    SHARED_ON_GAPPED_CURSOR,
    consumer_name,
    receiver_queue_size,
)


def test_ordered_subscriptions_name_the_newest_consumer_first() -> None:
    config = FunctionConfig(name="wc", inputs=["words"], retain_ordering=True)
    older = consumer_name(config, 0)
    time.sleep(0.001)
    newer = consumer_name(config, 2)
    assert newer < older
    assert older.endswith(":public/default/wc:0") and newer.endswith(":public/default/wc:2")


def test_shared_subscriptions_name_consumers_after_the_instance() -> None:
    config = FunctionConfig(name="wc", inputs=["words"])
    assert consumer_name(config, 1) == "public/default/wc:1"


GAPS_COST = InstanceOptions(shared_acks_cost_gaps=True)
WORDS = ["persistent://public/default/words"]


def test_instances_sharing_a_subscription_prefetch_few_where_its_gaps_cost_the_broker() -> None:
    shared = FunctionConfig(name="wc", inputs=["words"], parallelism=3)
    assert receiver_queue_size(shared, GAPS_COST, WORDS) == SHARED_ON_GAPPED_CURSOR
    assert receiver_queue_size(shared, InstanceOptions(), WORDS) == 1000


def test_a_lone_instance_or_an_ordered_subscription_keeps_the_default_queue() -> None:
    alone = FunctionConfig(name="wc", inputs=["words"])
    ordered = FunctionConfig(name="wc", inputs=["words"], parallelism=3, retain_ordering=True)
    assert receiver_queue_size(alone, GAPS_COST, WORDS) == 1000
    assert receiver_queue_size(ordered, GAPS_COST, WORDS) == 1000


def test_the_input_specs_receiver_queue_size_wins_the_smallest_for_one_consumer() -> None:
    config = FunctionConfig(
        name="wc",
        inputs=["other"],
        parallelism=3,
        input_specs={
            "words": ConsumerSpec(receiver_queue_size=5000),
            "persistent://public/default/lines": ConsumerSpec(receiver_queue_size=200),
            "logs-.*": ConsumerSpec(receiver_queue_size=7, is_regex=True),
        },
    )
    listed = list(config.input_serdes())
    assert receiver_queue_size(config, GAPS_COST, listed) == 200
    assert receiver_queue_size(config, GAPS_COST, WORDS) == 5000
    assert receiver_queue_size(config, GAPS_COST, ["logs-.*"]) == 7
    assert (
        receiver_queue_size(config, InstanceOptions(), ["persistent://public/default/other"])
        == 1000
    )


def test_a_large_receiver_queue_for_instances_sharing_on_pulsar_lite_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def config(size: int, parallelism: int = 3) -> FunctionConfig:
        return FunctionConfig(
            name="wc",
            inputs=["words"],
            parallelism=parallelism,
            input_specs={"words": ConsumerSpec(receiver_queue_size=size)},
        )

    with caplog.at_level(logging.WARNING, logger="magnetar.instance.subscription"):
        assert receiver_queue_size(config(1000), GAPS_COST, WORDS) == 1000
        assert [r.getMessage() for r in caplog.records] == [
            "public/default/wc: receiverQueueSize 1000 for instances sharing a subscription on "
            "pulsar-lite: the broker's work for each message grows with what the instances "
            "hold, and three instances prefetching 1,000 each fell seconds behind a steady "
            "10,000 msg/s they keep up with at 30 (Magnetar's choice without the setting)"
        ]
        caplog.clear()
        # within what kept up, alone, or on a broker whose gaps cost nothing: said nothing
        assert receiver_queue_size(config(300), GAPS_COST, WORDS) == 300
        assert receiver_queue_size(config(1000, parallelism=1), GAPS_COST, WORDS) == 1000
        assert receiver_queue_size(config(1000), InstanceOptions(), WORDS) == 1000
        assert caplog.records == []
