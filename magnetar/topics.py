"""Pulsar topic names: the short forms users type and the full form the broker reports."""

from __future__ import annotations

import re

__all__ = ["base_topic", "full_topic_name"]

_PARTITION_SUFFIX = re.compile(r"-partition-\d+$")


def full_topic_name(topic: str) -> str:
    """``my-topic`` -> ``persistent://public/default/my-topic``; ``t/ns/x`` -> ``persistent://t/ns/x``.

    Raises ``ValueError`` for a name that is neither a short name, ``tenant/namespace/topic``
    nor a full ``persistent://`` / ``non-persistent://`` name.
    """
    if "://" in topic:
        domain, _, rest = topic.partition("://")
        parts = rest.split("/")
        if domain not in ("persistent", "non-persistent") or len(parts) != 3 or not all(parts):
            raise ValueError(f"invalid topic name {topic!r}")
        return topic
    parts = topic.split("/")
    if len(parts) == 1 and topic:
        return f"persistent://public/default/{topic}"
    if len(parts) == 3 and all(parts):
        return f"persistent://{topic}"
    raise ValueError(
        f"invalid topic name {topic!r}: use 'name', 'tenant/namespace/name' or "
        "'persistent://tenant/namespace/name'"
    )


def base_topic(topic: str) -> str:
    """The full name of the topic a partition belongs to (``x-partition-3`` -> ``x``)."""
    return _PARTITION_SUFFIX.sub("", full_topic_name(topic))
