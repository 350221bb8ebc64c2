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

Instances sharing a subscription on pulsar-lite prefetch few messages. The broker hands a
Shared subscription's messages out one by one in turn, so what one consumer holds leaves gaps
between the messages the others acknowledge, and pulsar-lite reads and rewrites the whole list
of gaps on every acknowledgement and dispatch. With 1,000 prefetched per consumer, three
instances drained a backlog at 3,400 msg/s where one alone did 28,900, the broker spending
292 us a message; with 30, they did 9,200 (``bench/shared_prefetch.py``, medians). Their
acknowledgements also go out at once, not grouped for 100 ms (``acks_at_once``): what a
consumer has acknowledged but not yet sent leaves gaps too, and so they did 20,000.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pulsar

from magnetar.client import newest_first, subscribe
from magnetar.instance.acks_at_once import acking_at_once
from magnetar.instance.config import FunctionConfig, SubscriptionPosition, SubscriptionType
from magnetar.instance.exceptions import InstanceError
from magnetar.instance.options import InstanceOptions
from magnetar.topics import full_topic_name

__all__ = ["consumer_name", "instances_share", "open_consumers", "receiver_queue_size"]

SHARED_ON_GAPPED_CURSOR = 30
"""Messages each instance prefetches when it shares a subscription whose acknowledgements cost
the broker more with every gap (``InstanceOptions.shared_acks_cost_gaps``)."""
_GAPPED_CURSOR_KEPT_UP = 300
"""The most prefetched by each of three instances sharing such a subscription that was
measured keeping up with a steady 10,000 msg/s; at 1,000 they fell seconds behind."""

log = logging.getLogger(__name__)

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
        "negative_ack_redelivery_delay_ms": options.retry_delay_ms,
    }
    topics = list(config.input_serdes())
    # each consumer's target, and the inputSpecs keys it stands for; one topic is subscribed
    # by name, as Apache's instance does: a list makes the client add a consumer of consumers,
    # which hands each message over on another thread (a wake-up per message)
    targets: list[tuple[Any, list[str]]] = (
        [(topics[0] if len(topics) == 1 else topics, topics)] if topics else []
    )
    targets += [(_compile(p), [p]) for p in config.input_patterns()]
    take_over = config.subscription_type is SubscriptionType.FAILOVER
    if options.shared_acks_cost_gaps and instances_share(config):
        client = acking_at_once(client)
    consumers = []
    for target, keys in targets:
        kwargs["receiver_queue_size"] = receiver_queue_size(config, options, keys)
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
            if isinstance(target, re.Pattern):
                raise InstanceError(
                    f"cannot subscribe to topicsPattern {target.pattern!r}: {error}; the "
                    "broker must list a namespace's topics for this (the embedded "
                    "pulsar-lite broker cannot), so list the topics in inputs instead"
                ) from error
            raise InstanceError(
                f"cannot subscribe to {', '.join(keys)} as {config.subscription_name!r}: {error}"
            ) from error
    return consumers


def receiver_queue_size(config: FunctionConfig, options: InstanceOptions, topics: list[str]) -> int:
    """How many messages the consumer of ``topics`` (full topic names, or one pattern)
    prefetches: the smallest ``receiverQueueSize`` the function's ``inputSpecs`` set for them,
    as Apache Pulsar's instance takes it; else few where instances share a subscription whose
    gaps cost the broker (see the module doc); else the instance's default."""
    sizes = [
        spec.receiver_queue_size
        for key, spec in config.input_specs.items()
        if spec.receiver_queue_size is not None
        and (key if spec.is_regex else full_topic_name(key)) in topics
    ]
    if sizes:
        size = min(sizes)
        if (
            size > _GAPPED_CURSOR_KEPT_UP
            and options.shared_acks_cost_gaps
            and instances_share(config)
        ):
            log.warning(
                "%s: receiverQueueSize %d for instances sharing a subscription on pulsar-lite: "
                "the broker's work for each message grows with what the instances hold, and "
                "three instances prefetching 1,000 each fell seconds behind a steady 10,000 "
                "msg/s they keep up with at %d (Magnetar's choice without the setting)",
                config.fqfn,
                size,
                SHARED_ON_GAPPED_CURSOR,
            )
        return size
    if options.shared_acks_cost_gaps and instances_share(config):
        return min(SHARED_ON_GAPPED_CURSOR, options.receiver_queue_size)
    return options.receiver_queue_size


def instances_share(config: FunctionConfig) -> bool:
    """Whether the function's instances consume one subscription side by side (several
    instances, not an ordered subscription, where one consumer is active)."""
    return config.parallelism > 1 and config.subscription_type is not SubscriptionType.FAILOVER


def _subscribe(
    client: pulsar.Client, target: Any, config: FunctionConfig, name: str, kwargs: dict[str, Any]
) -> Any:
    return subscribe(client, target, config.subscription_name, consumer_name=name, **kwargs)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(full_topic_name(pattern) if "://" not in pattern else pattern)
