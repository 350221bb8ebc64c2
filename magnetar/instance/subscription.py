"""An instance's consumers: one for its listed input topics, one per topics pattern.

A Failover subscription delivers to one active consumer. pulsar-lite 0.2 makes active the
consumer whose name sorts first; a consumer whose connection was reset (its process killed
with messages in flight) is never removed from the subscription; and it rewinds the
subscription to its first unacknowledged message only when the *active* consumer leaves
(another consumer's messages stay with it until then). So the consumers of ordered
subscriptions are named newest first, and a new one *takes over*: a stand-in named newer
still subscribes first and becomes active, the instance's consumer subscribes and waits as
standby, and the stand-in closes, which rewinds the subscription and makes the instance's
consumer active: it receives everything unacknowledged, what the previous consumer (dead or
alive) was handed included, in order. On Apache Pulsar this costs one more subscribe and
changes nothing else.
"""

from __future__ import annotations

import re
from typing import Any

import pulsar

from magnetar.client import newest_first, subscribe
from magnetar.instance.config import FunctionConfig, SubscriptionPosition, SubscriptionType
from magnetar.instance.exceptions import InstanceError
from magnetar.instance.options import InstanceOptions
from magnetar.topics import full_topic_name

__all__ = ["consumer_name", "open_consumers"]

_SUBSCRIPTION_TYPES = {
    SubscriptionType.SHARED: pulsar.ConsumerType.Shared,
    SubscriptionType.FAILOVER: pulsar.ConsumerType.Failover,
    SubscriptionType.KEY_SHARED: pulsar.ConsumerType.KeyShared,
}
_POSITIONS = {
    SubscriptionPosition.LATEST: pulsar.InitialPosition.Latest,
    SubscriptionPosition.EARLIEST: pulsar.InitialPosition.Earliest,
}


def consumer_name(config: FunctionConfig, instance_id: int) -> str:
    """The instance's consumer name; on an ordered subscription a newer one sorts first."""
    name = f"{config.fqfn}:{instance_id}"
    if config.subscription_type is SubscriptionType.FAILOVER:
        return f"{newest_first()}:{name}"
    return name


def open_consumers(
    client: pulsar.Client, config: FunctionConfig, instance_id: int, options: InstanceOptions
) -> list[Any]:
    """Subscribe to the function's inputs: the consumer of the listed topics (if any)
    first, then one per topics pattern. No dead-letter policy: the instance counts failures
    itself (see ``retries``), since the client's policy counts every redelivery."""
    kwargs: dict[str, Any] = {
        "consumer_type": _SUBSCRIPTION_TYPES[config.subscription_type],
        "initial_position": _POSITIONS[config.subscription_position],
        "receiver_queue_size": options.receiver_queue_size,
        "negative_ack_redelivery_delay_ms": options.retry_delay_ms,
    }
    topics = list(config.input_serdes())
    targets: list[Any] = [topics] if topics else []
    targets += [_compile(p) for p in config.input_patterns()]
    take_over = config.subscription_type is SubscriptionType.FAILOVER
    consumers = []
    for target in targets:
        try:
            name = consumer_name(config, instance_id)
            if take_over:
                stand_in = _subscribe(
                    client,
                    target,
                    config,
                    consumer_name(config, instance_id),  # newer: sorts before ``name``
                    {**kwargs, "receiver_queue_size": 1},
                )
                consumer = _subscribe(client, target, config, name, kwargs)
                stand_in.close()
            else:
                consumer = _subscribe(client, target, config, name, kwargs)
            consumers.append(consumer)
        except Exception as error:
            for consumer in consumers:
                consumer.close()
            if not isinstance(target, list):
                raise InstanceError(
                    f"cannot subscribe to topicsPattern {target.pattern!r}: {error}; the "
                    "broker must list a namespace's topics for this (the embedded "
                    "pulsar-lite broker cannot), so list the topics in inputs instead"
                ) from error
            raise InstanceError(
                f"cannot subscribe to {', '.join(target)} as {config.subscription_name!r}: {error}"
            ) from error
    return consumers


def _subscribe(
    client: pulsar.Client, target: Any, config: FunctionConfig, name: str, kwargs: dict[str, Any]
) -> Any:
    return subscribe(client, target, config.subscription_name, consumer_name=name, **kwargs)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(full_topic_name(pattern) if "://" not in pattern else pattern)
