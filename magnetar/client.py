"""Pulsar clients for workers and instances, with a workaround for the embedded broker.

pulsar-lite 0.2 tells the consumers of a subscription apart by the consumer id the *client*
chose. Every client numbers its consumers from 0, so two processes joining one subscription
(instances of one function, workers electing a leader) collide: the second subscribe is
refused and times out. Each client therefore first uses up a random number of consumer ids
on a private topic (a reader costs well under a millisecond), and a subscribe that times out
is tried again, which takes the next id. Apache Pulsar tells consumers apart per
connection, so there the client asks the broker its name first (one handshake) and spreads
nothing: the readers cost some 0.3 s a client there.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import pulsar

from magnetar.broker_probe import server_version

__all__ = ["create_client", "newest_first", "subscribe"]

log = logging.getLogger(__name__)

_ID_SPREAD = 128
_SPREAD_TOPIC = "persistent://public/default/__magnetar_consumer_ids"
_SUBSCRIBE_ATTEMPTS = 4
_NEWEST_FIRST = 10**20


def create_client(service_url: str, operation_timeout_s: int = 3) -> pulsar.Client:
    """A quiet client whose consumer ids are unlikely to collide with other clients'."""
    client = pulsar.Client(
        service_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        operation_timeout_seconds=operation_timeout_s,
    )
    if not _needs_id_spread(service_url):
        return client
    try:
        for _ in range(random.randrange(_ID_SPREAD)):
            client.create_reader(_SPREAD_TOPIC, pulsar.MessageId.latest).close()
    except Exception as error:  # only an optimization: subscribe() still retries
        log.debug("spreading consumer ids failed: %s", error)
    return client


def _needs_id_spread(service_url: str) -> bool:
    """Whether the broker may be pulsar-lite (any broker that does not say what it is)."""
    try:
        version = server_version(service_url)
    except ValueError:  # a URL the client itself will refuse, with its own message
        return False
    return version is None or "lite" in version.lower()


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
