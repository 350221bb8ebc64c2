"""Refusing system topics that another kind of functions worker writes.

Apache Pulsar's functions worker keeps its state on ``public/functions/metadata`` and
``.../assignments`` as protobuf records (a ``ServiceRequest`` or ``FunctionMetaData`` keyed
by function, an ``Assignment`` keyed by instance) without message properties. A Magnetar
worker that replayed them would misread them, and its own records would confuse the other
worker, so it refuses to start on such topics and says what to do.
"""

from __future__ import annotations

import json
from typing import Any

import pulsar

from magnetar.client import open_reader
from magnetar.worker.cluster_key import SEAL_PROPERTY
from magnetar.worker.exceptions import ForeignSystemTopicError

__all__ = ["check_system_topics"]

_READ_TIMEOUT_MS = 5000


def check_system_topics(client: pulsar.Client, metadata_topic: str, assignments_topic: str) -> None:
    """ForeignSystemTopicError when the first record of the metadata or assignments topic
    is not a Magnetar worker's."""
    for topic, is_magnetars in (
        (metadata_topic, _is_metadata_record),
        (assignments_topic, _is_assignment_record),
    ):
        message = _first_message(client, topic)
        if message is not None and not is_magnetars(message):
            raise ForeignSystemTopicError(
                f"{topic} holds records that are not a Magnetar worker's (another functions "
                f"worker, such as Apache Pulsar's, writes there; message {message.message_id()}"
                "): Magnetar cannot share its system topics. Give Magnetar a namespace of its "
                "own with system_namespace (the default is public/magnetar), or stop the other "
                "functions worker on this cluster"
            )


def _first_message(client: pulsar.Client, topic: str) -> Any:
    """The topic's first message, None when it has none."""
    reader = open_reader(client, topic, pulsar.MessageId.earliest, receiver_queue_size=1)
    try:
        try:
            if not reader.has_message_available():
                return None
        except Exception:
            return None  # pulsar-lite cannot give the last message id of an empty topic
        try:
            return reader.read_next(_READ_TIMEOUT_MS)
        except pulsar.Timeout:
            return None
    finally:
        reader.close()


def _is_metadata_record(message: Any) -> bool:
    properties = message.properties()
    return SEAL_PROPERTY in properties or {"term", "leader"} <= properties.keys()


def _is_assignment_record(message: Any) -> bool:
    if SEAL_PROPERTY in message.properties():
        return True
    try:
        record = json.loads(message.data())
    except ValueError:
        return False
    return isinstance(record, dict) and {"term", "version", "leader"} <= record.keys()
