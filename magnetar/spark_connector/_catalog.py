"""Which topics and partitions a read covers: ``topic``/``topics`` as named, ``topicsPattern``
through the admin API, and ``waitingForNonExistedTopic``."""

from __future__ import annotations

import logging
import re
import time

import pulsar

from magnetar.spark_connector._admin import AdminClient, AdminUnavailableError
from magnetar.spark_connector._client import topic_partitions
from magnetar.spark_connector._options import SourceOptions
from magnetar.spark_connector.exceptions import InvalidOptionError

__all__ = ["admin_client", "partitions_of", "topics_of"]

log = logging.getLogger(__name__)

WAIT_INTERVAL_S = 5.0
"""How often a missing topic is looked for again (StreamNative's interval)."""


def admin_client(options: SourceOptions) -> AdminClient | None:
    """The admin API client of ``admin.url``, if given."""
    if options.admin_url is None:
        return None
    return AdminClient(options.admin_url, options.admin_conf)


def topics_of(options: SourceOptions, admin: AdminClient | None) -> list[str]:
    """Full names of the topics read, once they exist if ``waitingForNonExistedTopic``."""
    if options.topics_pattern is None:
        topics = list(options.topics)
    else:
        assert admin is not None  # parse_source_options insists on admin.url
        topics = _matching(options.topics_pattern, admin)
    if options.waiting_for_non_existed_topic:
        _wait_for(topics, admin)
    return topics


def partitions_of(client: pulsar.Client, topics: list[str]) -> list[str]:
    """The partitions of ``topics`` (a topic that is not partitioned stands for itself),
    sorted."""
    return sorted(p for topic in topics for p in topic_partitions(client, topic))


def _matching(pattern: str, admin: AdminClient) -> list[str]:
    domain, _, rest = pattern.partition("://")
    parts = rest.split("/", 2)
    if len(parts) != 3 or any(re.escape(p) != p for p in parts[:2]):
        raise InvalidOptionError(
            f"topicsPattern {pattern!r} must name its tenant and namespace literally, as in "
            "persistent://public/default/orders-.*"
        )
    tenant, namespace, _ = parts
    try:
        listed = admin.topics(tenant, namespace, persistent=domain == "persistent")
    except AdminUnavailableError as error:
        raise InvalidOptionError(
            f"topicsPattern needs Pulsar's admin API to list topics, but {error}; the "
            "embedded broker (pulsar-lite) has no admin API: name the topics in 'topics'"
        ) from None
    compiled = re.compile(pattern)
    return sorted(topic for topic in listed if compiled.fullmatch(topic))


def _wait_for(topics: list[str], admin: AdminClient | None) -> None:
    """Return once every topic exists. Without an admin API a topic cannot be told to
    exist before it is used, and brokers that create topics on first use (pulsar-lite,
    Pulsar's default) make every topic exist: then nothing is waited for."""
    if admin is None:
        log.info("waitingForNonExistedTopic without admin.url: topics are created on first use")
        return
    waiting = list(topics)
    while waiting:
        try:
            waiting = [topic for topic in waiting if not admin.topic_exists(topic)]
        except AdminUnavailableError as error:
            log.warning("%s; not waiting for topics to be created", error)
            return
        if waiting:
            log.info("waiting for %s to be created", ", ".join(waiting))
            time.sleep(WAIT_INTERVAL_S)
