"""Pulsar clients for workers and instances, with a workaround for the embedded broker.

pulsar-lite 0.2 tells the consumers of a subscription apart by the consumer id the *client*
chose. Every client numbers its consumers from 0, so two processes joining one subscription
(instances of one function, workers electing a leader) collide: the second subscribe is
refused and times out. Each client therefore first uses up a random number of consumer ids
on a private topic, and a subscribe that times out is tried again, which takes the next id.
The topic is non-persistent: pulsar-lite never removes a closed reader's subscription, and on
a persistent topic every one of them is a stored cursor that makes the next subscribe slower
(from 1.5 ms to 20 ms a reader after a few thousand); on a non-persistent topic a reader
costs half a millisecond and leaves nothing behind. On Apache Pulsar, where ids are per
connection, this costs a few cheap readers at startup and nothing else.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import pulsar

__all__ = ["create_client", "newest_first", "subscribe"]

log = logging.getLogger(__name__)

_ID_SPREAD = 128
_SPREAD_TOPIC = "non-persistent://public/default/__magnetar_consumer_ids"
_SUBSCRIBE_ATTEMPTS = 4
_NEWEST_FIRST = 10**20


def create_client(service_url: str, operation_timeout_s: int = 3) -> pulsar.Client:
    """A quiet client whose consumer ids are unlikely to collide with other clients'."""
    client = pulsar.Client(
        service_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        operation_timeout_seconds=operation_timeout_s,
    )
    try:
        for _ in range(random.randrange(_ID_SPREAD)):
            client.create_reader(_SPREAD_TOPIC, pulsar.MessageId.latest).close()
    except Exception as error:  # only an optimization: subscribe() still retries
        log.debug("spreading consumer ids failed: %s", error)
    return client


def subscribe(client: pulsar.Client, topic: Any, subscription: str, **kwargs: Any) -> Any:
    """``client.subscribe`` that tries again when the broker refuses a colliding consumer id."""
    for _ in range(_SUBSCRIBE_ATTEMPTS - 1):
        try:
            return client.subscribe(topic, subscription, **kwargs)
        except pulsar.Timeout:
            log.info(
                "subscribing to %s as %r timed out; trying again with a new consumer id",
                topic,
                subscription,
            )
    return client.subscribe(topic, subscription, **kwargs)


def newest_first() -> str:
    """A consumer-name part that sorts before every one made earlier: pulsar-lite makes the
    Failover consumer whose name sorts first the active one."""
    return f"{_NEWEST_FIRST - time.time_ns():020d}"
