"""The data source options: parsed once, checked, with errors that name the option.

Names and meanings are those of the StreamNative pulsar-spark connector (its README and
``PulsarProvider``). Spark hands the options over with lower-cased keys, so every name here
is matched case-insensitively. Unlike StreamNative, an option nobody knows is an error (a
typo would otherwise be silently ignored); every option StreamNative knows is accepted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from magnetar.spark_connector._offsets import (
    Position,
    end_position,
    inclusive_start_position,
    parse_offsets_json,
    parse_times_json,
)
from magnetar.spark_connector._passthrough import (
    ADMIN_PREFIX,
    CLIENT_PREFIX,
    PRODUCER_PREFIX,
    READER_PREFIX,
    check_module_options,
)
from magnetar.spark_connector._ranges import ReadPath
from magnetar.spark_connector._topic_schema import TopicSchema
from magnetar.spark_connector.exceptions import InvalidOptionError, SchemaError
from magnetar.topics import full_topic_name

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bound",
    "SinkOptions",
    "SourceOptions",
    "TimeBound",
    "check_read_options",
    "parse_sink_options",
    "parse_source_options",
]

Mode = Literal["batch", "stream", "any"]
"""The query a source is checked for; "any" checks what does not depend on it (at load)."""

EARLIEST = "earliest"
LATEST = "latest"

Bound = str | dict[str, Position | str]
"""``"earliest"``, ``"latest"``, or full topic (partition) name -> a position (for a start,
right before the given message; for an end, the given message's own) or ``"earliest"`` /
``"latest"`` (``MessageId.earliest`` / ``MessageId.latest`` in the JSON)."""

TimeBound = int | dict[str, int] | None
"""A publish time in ms for every topic, per topic (``{"<topic>": ms}``), or none."""

DEFAULT_POLL_TIMEOUT_MS = 120_000
"""How long a read waits for a message known to exist before it gives up (as StreamNative)."""
DEFAULT_RECEIVER_QUEUE_SIZE = 1000

_SCHEMA_TYPE = "schema.type"
_SCHEMA_DEFINITION = "schema.definition"
_COMMON_KEYS = {"service.url", "admin.url", _SCHEMA_TYPE, _SCHEMA_DEFINITION}
_SOURCE_KEYS = _COMMON_KEYS | {
    "topic",
    "topics",
    "topicspattern",
    "startingoffsets",
    "endingoffsets",
    "startingtime",
    "endingtime",
    "failondataloss",
    "polltimeoutms",
    "maxrecordspertrigger",
    "maxbytespertrigger",
    "predefinedsubscription",
    "subscriptionprefix",
    "waitingfornonexistedtopic",
    "allowdifferenttopicschemas",
    "magnetar.readpath",
}
_SINK_KEYS = _COMMON_KEYS | {"topic"}
_SPARK_KEYS = {"checkpointlocation", "path"}
"""Options of the query itself that Spark also hands to the data source."""


@dataclass(frozen=True)
class SourceOptions:
    """What to read and how, checked for one kind of query (batch or streaming)."""

    service_url: str
    """``service.url``: the Pulsar service URL."""
    topics: tuple[str, ...]
    """Full names of the topics given by ``topic`` or ``topics``, sorted (none with
    ``topicsPattern``)."""
    starting: Bound
    """``startingOffsets``; a message id given here is included."""
    ending: Bound
    """``endingOffsets`` (batch only); a message id given here is included."""
    topics_pattern: str | None = None
    """``topicsPattern`` as a regular expression over full topic names (needs ``admin.url``)."""
    starting_time: TimeBound = None
    """``startingTime``: only messages published at or after this time (ms)."""
    ending_time: TimeBound = None
    """``endingTime`` (batch only): only messages published before this time (ms)."""
    fail_on_data_loss: bool = False
    """``failOnDataLoss``: fail when a range cannot be read to its end; StreamNative's
    default is false (log a warning and go on)."""
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    """``pollTimeoutMs``: longest wait for a message known to exist."""
    max_records_per_trigger: int | None = None
    """``maxRecordsPerTrigger`` (streaming): most messages per micro-batch."""
    max_bytes_per_trigger: int | None = None
    """``maxBytesPerTrigger`` (streaming, with ``admin.url``): a soft limit of payload bytes
    per micro-batch (at least one message)."""
    admin_url: str | None = None
    """``admin.url``: Pulsar's admin API, for topicsPattern and schemas."""
    predefined_subscription: str | None = None
    """``predefinedSubscription``: the subscription a streaming query keeps at its progress
    (created if need be, never deleted)."""
    subscription_prefix: str | None = None
    """``subscriptionPrefix``: prefix of the subscriptions the connector creates."""
    waiting_for_non_existed_topic: bool = False
    """``waitingForNonExistedTopic``: wait for missing topics to be created (admin.url)."""
    allow_different_topic_schemas: bool = False
    """``allowDifferentTopicSchemas``: ignore schemas, ``value`` is bytes."""
    schema: TopicSchema | None = None
    """``schema.type`` / ``schema.definition``: the values' schema, for a broker that has
    none (overrides the broker's)."""
    client_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.client.*`` settings, by their Java client names."""
    admin_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.admin.*`` settings (the client's when none are given)."""
    reader_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.reader.*`` settings, by their Java names."""
    read_path: ReadPath = "auto"
    """``magnetar.readPath`` (Magnetar's own): ``auto`` reads with the native reader where it
    can and the Python client elsewhere; ``native`` or ``python`` only one way (default: the
    environment variable ``MAGNETAR_SPARK_READ_PATH``, else auto)."""


@dataclass(frozen=True)
class SinkOptions:
    """Where to write."""

    service_url: str
    """``service.url``: the Pulsar service URL."""
    topic: str | None
    """``topic``: the topic of every row; None means each row's ``__topic`` column."""
    admin_url: str | None = None
    """``admin.url``: where to look the topic's schema up."""
    schema: TopicSchema | None = None
    """``schema.type`` / ``schema.definition``: how to encode values."""
    client_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.client.*`` settings, by their Java client names."""
    admin_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.admin.*`` settings (the client's when none are given)."""
    producer_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.producer.*`` settings, by their Java client names."""


def parse_source_options(options: Mapping[str, str], mode: Mode) -> SourceOptions:
    """Check the options of ``spark.read`` (``mode="batch"``) or ``spark.readStream``
    (``"stream"``)."""
    opts = {key.lower(): value for key, value in options.items()}
    _check_keys(opts, _SOURCE_KEYS, (CLIENT_PREFIX, ADMIN_PREFIX, READER_PREFIX), "reading")
    client_conf = check_module_options("client", opts)
    admin_conf = check_module_options("admin", opts) or client_conf
    reader_conf = check_module_options("reader", opts)
    admin_url = _admin_url(opts)
    topics, pattern = _topics(opts)
    if pattern is not None and admin_url is None:
        raise InvalidOptionError(
            "topicsPattern needs admin.url: topics are listed through Pulsar's admin API (the "
            "Python client cannot list a namespace's topics, and the embedded broker, "
            "pulsar-lite, has no admin API at all); name the topics in 'topics' instead"
        )
    known = None if pattern is not None else topics
    starting_time = _time(opts, "startingTime", known)
    ending_time = _time(opts, "endingTime", known)
    if starting_time is not None and "startingoffsets" in opts:
        raise InvalidOptionError("set startingOffsets or startingTime, not both")
    if ending_time is not None and "endingoffsets" in opts:
        raise InvalidOptionError("set endingOffsets or endingTime, not both")
    default_start = EARLIEST if mode == "batch" or starting_time is not None else LATEST
    starting = _bound(opts, "startingOffsets", known, default_start)
    max_bytes = _positive_int(opts, "maxBytesPerTrigger")
    if mode == "batch":
        ending = _bound(opts, "endingOffsets", known, LATEST)
        _check_batch_bounds(starting, ending)
        max_records = None  # a rate limit means nothing to one batch read
    elif mode == "any":
        ending, max_records = LATEST, None
    else:
        for option in ("endingOffsets", "endingTime"):
            if option.lower() in opts:
                raise InvalidOptionError(
                    f"{option} is not allowed in a streaming query (ending offset not valid in "
                    "streaming queries), which reads until it is stopped; use "
                    "Trigger.AvailableNow to stop at the messages there now"
                )
        ending = LATEST
        max_records = _positive_int(opts, "maxRecordsPerTrigger")
        if max_bytes is not None and admin_url is None:
            raise InvalidOptionError(
                "admin.url must be specified if maxBytesPerTrigger is specified (as with "
                "StreamNative's connector)"
            )
    return SourceOptions(
        service_url=_service_url(opts),
        topics=topics,
        topics_pattern=pattern,
        starting=starting,
        ending=ending,
        starting_time=starting_time,
        ending_time=ending_time,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", False),
        poll_timeout_ms=_positive_int(opts, "pollTimeoutMs") or DEFAULT_POLL_TIMEOUT_MS,
        max_records_per_trigger=max_records,
        max_bytes_per_trigger=max_bytes if mode == "stream" else None,
        admin_url=admin_url,
        predefined_subscription=_name(opts, "predefinedSubscription"),
        subscription_prefix=_name(opts, "subscriptionPrefix"),
        waiting_for_non_existed_topic=_bool(opts, "waitingForNonExistedTopic", False),
        allow_different_topic_schemas=_bool(opts, "allowDifferentTopicSchemas", False),
        schema=_schema(opts),
        client_conf=client_conf,
        admin_conf=admin_conf,
        reader_conf=reader_conf,
        read_path=_read_path(opts),
    )


def check_read_options(options: Mapping[str, str], streaming: bool = False) -> None:
    """Raise :class:`InvalidOptionError` for read options Spark would reject when it plans
    the query, before anything starts."""
    parse_source_options(options, "stream" if streaming else "batch")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Check the options of ``df.write`` / ``df.writeStream``."""
    opts = {key.lower(): value for key, value in options.items()}
    for option in ("topics", "topicspattern"):
        if option in opts:
            raise InvalidOptionError(
                "Currently, we only support specify single topic through option, use 'topic' "
                f"to specify it (got {option}); or give the rows a __topic column"
            )
    _check_keys(opts, _SINK_KEYS, (CLIENT_PREFIX, ADMIN_PREFIX, PRODUCER_PREFIX), "writing")
    client_conf = check_module_options("client", opts)
    topic = opts.get("topic", "").strip()
    return SinkOptions(
        service_url=_service_url(opts),
        topic=_topic_name("topic", topic) if topic else None,
        admin_url=_admin_url(opts),
        schema=_schema(opts),
        client_conf=client_conf,
        admin_conf=check_module_options("admin", opts) or client_conf,
        producer_conf=check_module_options("producer", opts),
    )


def _check_keys(
    opts: Mapping[str, str], known: set[str], prefixes: tuple[str, ...], what: str
) -> None:
    for key in opts:
        if key in known or key in _SPARK_KEYS or key.startswith(prefixes):
            continue
        accepted = sorted(known) + [p + "*" for p in prefixes]
        raise InvalidOptionError(f"unknown option {key!r}; accepted {what}: {', '.join(accepted)}")


def _service_url(opts: Mapping[str, str]) -> str:
    url = opts.get("service.url", "").strip()
    if not url:
        raise InvalidOptionError(
            "option service.url is required: the Pulsar service URL, e.g. pulsar://localhost:6650"
        )
    if not url.startswith(("pulsar://", "pulsar+ssl://")):
        raise InvalidOptionError(
            f"service.url {url!r} is not a Pulsar service URL (pulsar:// or pulsar+ssl://)"
        )
    return url


def _admin_url(opts: Mapping[str, str]) -> str | None:
    url = opts.get("admin.url", "").strip()
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise InvalidOptionError(
            f"admin.url {url!r} is not the HTTP URL of Pulsar's admin API, e.g. "
            "http://localhost:8080"
        )
    return url


def _topics(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    given = [key for key in ("topic", "topics", "topicspattern") if key in opts]
    if len(given) != 1:
        what = "none" if not given else ", ".join(given)
        raise InvalidOptionError(
            "You should specify topic(s) using one of the topic options: topic, topics, "
            f"topicsPattern (got {what})"
        )
    option, value = given[0], opts[given[0]]
    if option == "topicspattern":
        if not value.strip():
            raise InvalidOptionError("TopicsPattern is empty")
        return (), _pattern(value.strip())
    names = [name.strip() for name in value.split(",")]
    if option == "topic" and len(names) > 1:
        raise InvalidOptionError('Use "topics" instead of "topic" for multi topic read')
    if not any(names):
        raise InvalidOptionError(
            "No topic is specified" if option == "topic" else "No topics is specified"
        )
    return tuple(sorted({_topic_name(option, name) for name in names if name})), None


def _pattern(text: str) -> str:
    """A pattern over full names: ``orders-.*`` means ``persistent://public/default/orders-.*``
    (as Pulsar's TopicName makes of it)."""
    if "://" not in text:
        parts = text.split("/")
        text = f"persistent://public/default/{text}" if len(parts) == 1 else f"persistent://{text}"
    try:
        re.compile(text)
    except re.error as error:
        raise InvalidOptionError(
            f"topicsPattern {text!r} is not a regular expression: {error}"
        ) from None
    return text


def _topic_name(option: str, name: str) -> str:
    try:
        return full_topic_name(name)
    except ValueError as error:
        raise InvalidOptionError(f"option {option}: {error}") from None


def _bound(
    opts: Mapping[str, str], option: str, topics: tuple[str, ...] | None, default: str
) -> Bound:
    text = opts.get(option.lower(), default).strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    if not text.startswith("{"):
        raise InvalidOptionError(
            f"{option} must be 'earliest', 'latest' or JSON "
            f'{{"<topic>": [message id bytes]}}, got {text!r}'
        )
    ids = parse_offsets_json(option, text, topics)
    as_position = inclusive_start_position if option.startswith("starting") else end_position
    bound: dict[str, Position | str] = {}
    for topic, message_id in ids.items():
        if message_id.ledger_id() == message_id.entry_id() == -1:
            bound[topic] = EARLIEST  # MessageId.earliest
        elif message_id.ledger_id() == message_id.entry_id() == 2**63 - 1:
            bound[topic] = LATEST  # MessageId.latest
        else:
            bound[topic] = as_position(message_id)
    return bound


def _check_batch_bounds(starting: Bound, ending: Bound) -> None:
    """StreamNative's rules for batch queries, and ranges that can hold no message."""
    if starting == LATEST or (isinstance(starting, dict) and LATEST in starting.values()):
        raise InvalidOptionError(
            "starting offset can't be latest for batch queries on Pulsar "
            "(startingOffsets='latest' or MessageId.latest would read nothing); use "
            "'earliest' or message ids"
        )
    if ending == EARLIEST or (isinstance(ending, dict) and EARLIEST in ending.values()):
        raise InvalidOptionError(
            "ending offset can't be earliest for batch queries on Pulsar "
            "(endingOffsets='earliest' or MessageId.earliest would read nothing); use "
            "'latest' or message ids"
        )
    if isinstance(starting, dict) and isinstance(ending, dict):
        for topic, start in starting.items():
            end = ending.get(topic)
            if isinstance(start, tuple) and isinstance(end, tuple) and end <= start:
                raise InvalidOptionError(
                    f"startingOffsets for {topic} is after its endingOffsets: the range holds "
                    "no message"
                )


def _time(opts: Mapping[str, str], option: str, topics: tuple[str, ...] | None) -> TimeBound:
    text = opts.get(option.lower())
    if text is None:
        return None
    text = text.strip()
    if text.startswith("{"):
        return parse_times_json(option, text, topics)
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidOptionError(
            f"{option} must be a publish time in milliseconds since the epoch, or JSON "
            f'{{"<topic>": ms}}, got {text!r}'
        )
    return value


def _read_path(opts: Mapping[str, str]) -> ReadPath:
    text = opts.get("magnetar.readpath") or os.environ.get("MAGNETAR_SPARK_READ_PATH") or "auto"
    for path in get_args(ReadPath):
        if text.strip().lower() == path:
            return path  # type: ignore[no-any-return]
    raise InvalidOptionError(
        f"magnetar.readPath must be one of {', '.join(get_args(ReadPath))}, got {text!r}"
    )


def _positive_int(opts: Mapping[str, str], option: str) -> int | None:
    text = opts.get(option.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidOptionError(f"{option} must be a positive integer, got {text!r}")
    return value


def _bool(opts: Mapping[str, str], option: str, default: bool) -> bool:
    text = opts.get(option.lower())
    if text is None:
        return default
    try:
        value = json.loads(text.lower())
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{option} must be true or false, got {text!r}")
    return value


def _name(opts: Mapping[str, str], option: str) -> str | None:
    text = opts.get(option.lower(), "").strip()
    return text or None


def _schema(opts: Mapping[str, str]) -> TopicSchema | None:
    kind = opts.get(_SCHEMA_TYPE)
    definition = opts.get(_SCHEMA_DEFINITION)
    if kind is None:
        if definition is not None:
            raise InvalidOptionError(f"{_SCHEMA_DEFINITION} is set but {_SCHEMA_TYPE} is not")
        return None
    try:
        return TopicSchema.of(kind, definition, f"option {_SCHEMA_TYPE}")
    except SchemaError as error:
        raise InvalidOptionError(str(error)) from None
