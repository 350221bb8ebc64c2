"""Where a topic's schema comes from, in order:

1. the options ``schema.type`` / ``schema.definition``, when given (for every topic read);
2. Pulsar's admin API at ``admin.url``, when it answers;
3. the broker, through the binary protocol's schema lookup (``GetSchema``), where it has a
   schema registry;
4. on a broker without one (pulsar-lite, which leaves the lookup unanswered), the schemas this
   connector recorded when it wrote to the topic, on the topic ``SCHEMA_REGISTRY_TOPIC``:
   what Pulsar's registry would hold had the broker one.

A topic with none of these has no schema: its values are bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pulsar

from magnetar.broker import BrokerError
from magnetar.broker_probe import broker_version
from magnetar.spark_connector._admin import AdminClient, AdminUnavailableError
from magnetar.spark_connector._offsets import position_of
from magnetar.spark_connector._topic_schema import NO_SCHEMA, TopicSchema
from magnetar.spark_connector.exceptions import PulsarReadError, SchemaError
from magnetar.topics import base_topic

__all__ = [
    "SCHEMA_REGISTRY_TOPIC",
    "SchemaSource",
    "broker_has_registry",
    "record_schema",
    "recorded_schemas",
]

log = logging.getLogger(__name__)

SCHEMA_REGISTRY_TOPIC = "persistent://public/functions/schemas"
"""Schemas of topics on a broker without a registry: key = topic, value = JSON."""

_REGISTRY_READ_MS = 2000
_VERSIONS: dict[str, str | None] = {}
"""Brokers' reported versions by service URL, asked once per process."""


def broker_has_registry(service_url: str) -> bool:
    """Whether the broker answers the binary protocol's schema lookup: every Pulsar does;
    pulsar-lite (which reports itself as ``Pulsar-Lite-...``) leaves it unanswered."""
    if service_url not in _VERSIONS:
        try:
            _VERSIONS[service_url] = broker_version(service_url)
        except BrokerError as error:
            raise PulsarReadError(str(error)) from None
    version = _VERSIONS[service_url]
    return not (version or "").lower().startswith("pulsar-lite")


@dataclass
class SchemaSource:
    """Looks topics' schemas up (on the driver, or an executor writing to a topic)."""

    client: pulsar.Client
    service_url: str
    admin: AdminClient | None = None
    explicit: TopicSchema | None = None
    """From ``schema.type`` / ``schema.definition``: overrides everything else."""

    def schema_of(self, topic: str) -> TopicSchema:
        """The schema of one topic (a full name; a partition stands for its topic)."""
        if self.explicit is not None:
            return self.explicit
        topic = base_topic(topic)
        if self.admin is not None:
            try:
                answer = self.admin.schema(topic)
            except AdminUnavailableError as error:
                log.warning("%s; looking schemas up through the broker instead", error)
                self.admin = None
            else:
                if answer is None:
                    return NO_SCHEMA
                return _normalised(
                    TopicSchema.of(
                        str(answer["type"]),
                        str(answer.get("data") or ""),
                        f"admin API schema of {topic}",
                    )
                )
        if broker_has_registry(self.service_url):
            return self._from_broker(topic)
        return recorded_schemas(self.client, [topic]).get(topic, NO_SCHEMA)

    def common_schema(self, topics: Iterable[str]) -> TopicSchema:
        """The one schema all ``topics`` share; :class:`SchemaError` when they differ."""
        schemas = {topic: self.schema_of(topic) for topic in topics}
        distinct = set(schemas.values())
        if len(distinct) > 1:
            listed = "; ".join(f"{t}: {s.describe()}" for t, s in sorted(schemas.items()))
            raise SchemaError(
                f"Topics to read must share identical schema. Consider setting "
                f"'allowDifferentTopicSchemas' to 'true' to read them as bytes. We got "
                f"{len(distinct)} distinct schemas: {listed}"
            )
        return distinct.pop() if distinct else NO_SCHEMA

    def _from_broker(self, topic: str) -> TopicSchema:
        try:
            info = self.client._client.get_schema_info(topic, -1)
        except pulsar.TopicNotFound:
            return NO_SCHEMA  # Pulsar's answer for a topic without a schema
        except pulsar.PulsarException as error:
            raise PulsarReadError(f"cannot look up the schema of {topic}: {error}") from None
        kind = info.schema_type().name
        return _normalised(TopicSchema.of(str(kind), info.schema(), f"broker schema of {topic}"))


def _normalised(schema: TopicSchema) -> TopicSchema:
    """BYTES and no schema read the same: one ``value`` of bytes."""
    return NO_SCHEMA if schema.is_raw else schema


def recorded_schemas(client: pulsar.Client, topics: Iterable[str]) -> dict[str, TopicSchema]:
    """The latest schema recorded for each of ``topics`` on the registry topic."""
    wanted = set(topics)
    found: dict[str, TopicSchema] = {}
    for topic, record in _registry_records(client):
        if topic in wanted:
            found[topic] = record
    return found


def _registry_records(client: pulsar.Client) -> list[tuple[str, TopicSchema]]:
    reader = client.create_reader(SCHEMA_REGISTRY_TOPIC, pulsar.MessageId.earliest)
    records: list[tuple[str, TopicSchema]] = []
    last = (-1, -1, -1)
    try:
        while _more(reader):
            try:
                message = reader.read_next(_REGISTRY_READ_MS)
            except pulsar.Timeout:
                break
            position = position_of(message.message_id())
            if position <= last:
                continue  # a redelivery
            last = position
            record = _parse_record(message.data())
            if record is not None:
                records.append((message.partition_key(), record))
    finally:
        reader.close()
    return records


def _more(reader: Any) -> bool:
    try:
        return bool(reader.has_message_available())
    except pulsar.PulsarException:
        return False  # pulsar-lite answers an empty topic with an error


def _parse_record(data: bytes) -> TopicSchema | None:
    try:
        record = json.loads(data)
        return TopicSchema.of(record["type"], record.get("definition") or None)
    except (ValueError, KeyError, TypeError, SchemaError):
        log.warning("ignoring a malformed record on %s: %r", SCHEMA_REGISTRY_TOPIC, data[:200])
        return None


def record_schema(client: pulsar.Client, topic: str, schema: TopicSchema) -> None:
    """Record ``schema`` as ``topic``'s, where the broker keeps no schemas."""
    producer = client.create_producer(SCHEMA_REGISTRY_TOPIC, batching_enabled=False)
    try:
        producer.send(json.dumps(schema.to_json()).encode(), partition_key=base_topic(topic))
    finally:
        producer.close()
