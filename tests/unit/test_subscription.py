"""Consumer names: on an ordered (Failover) subscription the newest consumer sorts first."""

from __future__ import annotations

import time

from magnetar.instance import FunctionConfig
from magnetar.instance.subscription import consumer_name


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
