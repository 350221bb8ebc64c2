"""An instance's consumers: one for its listed input topics, one per topics pattern.

A Failover subscription delivers to one active consumer. pulsar-lite 0.2 makes active the
consumer whose name sorts first, and a consumer whose connection was reset (its process
killed with messages in flight) is never removed from the subscription: if it stayed first,
the subscription would deliver to no one until the broker restarts. So the consumers of
ordered subscriptions are named newest first, and a new one *takes over*: it subscribes,
becoming active, and closes at once, which makes the broker rewind the subscription to its
first unacknowledged message (what the dead consumer was handed included), then subscribes
for good. On Apache Pulsar this costs one more subscribe and changes nothing else.
"""

from __future__ import annotations

import re
from typing import Any

import pulsar

from magnetar.client import newest_first, subscribe
from magnetar.instance.config import FunctionConfig, SubscriptionPosition, SubscriptionType
from magnetar.instance.exceptions import InstanceError
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
    client: pulsar.Client,
    config: FunctionConfig,
    instance_id: int,
    receiver_queue_size: int,
    negative_ack_redelivery_delay_ms: int,
) -> list[Any]:
    """Subscribe to the function's inputs: the consumer of the listed topics (if any)
    first, then one per topics pattern."""
    kwargs: dict[str, Any] = {
        "consumer_type": _SUBSCRIPTION_TYPES[config.subscription_type],
        "initial_position": _POSITIONS[config.subscription_position],
        "receiver_queue_size": receiver_queue_size,
        "negative_ack_redelivery_delay_ms": negative_ack_redelivery_delay_ms,
    }
    if config.max_message_retries is not None:
        kwargs["dead_letter_policy"] = pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=config.max_message_retries,
            dead_letter_topic=(
                full_topic_name(config.dead_letter_topic) if config.dead_letter_topic else None
            ),
        )
    topics = list(config.input_serdes())
    targets: list[Any] = [topics] if topics else []
    targets += [_compile(p) for p in config.input_patterns()]
    take_over = config.subscription_type is SubscriptionType.FAILOVER
    consumers = []
    for target in targets:
        try:
            if take_over:
                _subscribe(client, target, config, instance_id, kwargs).close()
            consumers.append(_subscribe(client, target, config, instance_id, kwargs))
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
    client: pulsar.Client,
    target: Any,
    config: FunctionConfig,
    instance_id: int,
    kwargs: dict[str, Any],
) -> Any:
    name = consumer_name(config, instance_id)
    return subscribe(client, target, config.subscription_name, consumer_name=name, **kwargs)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(full_topic_name(pattern) if "://" not in pattern else pattern)
