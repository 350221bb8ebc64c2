"""The data source options: parsed once, checked, with errors that name the option.

Names and meanings are those of the StreamNative pulsar-spark connector. Spark hands the
options over with lower-cased keys, so every name here is matched case-insensitively.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from magnetar.spark_connector._offsets import (
    Position,
    end_position,
    inclusive_start_position,
    parse_offsets_json,
)
from magnetar.spark_connector.exceptions import InvalidOptionError
from magnetar.topics import full_topic_name

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bound",
    "SinkOptions",
    "SourceOptions",
    "check_read_options",
    "parse_sink_options",
    "parse_source_options",
]

Mode = Literal["batch", "stream"]

EARLIEST = "earliest"
LATEST = "latest"

Bound = str | dict[str, Position]
"""``"earliest"``, ``"latest"``, or full topic name -> position: for a start, the position
right before the given message; for an end, the given message's own."""

DEFAULT_POLL_TIMEOUT_MS = 120_000
"""How long a read waits for a message known to exist before it gives up (as StreamNative)."""
DEFAULT_RECEIVER_QUEUE_SIZE = 1000

_CLIENT_PREFIX = "pulsar.client."
_READER_PREFIX = "pulsar.reader."
_CLIENT_KEYS = {
    "authpluginclassname": "authPluginClassName",
    "authparams": "authParams",
    "operationtimeoutms": "operationTimeoutMs",
    "connectiontimeoutms": "connectionTimeoutMs",
    "usetls": "useTls",
    "tlstrustcertsfilepath": "tlsTrustCertsFilePath",
    "tlsallowinsecureconnection": "tlsAllowInsecureConnection",
    "tlshostnameverificationenable": "tlsHostnameVerificationEnable",
    "listenername": "listenerName",
    "iothreads": "ioThreads",
}
_READER_KEYS = {"receiverqueuesize": "receiverQueueSize"}
_SOURCE_KEYS = {
    "service.url",
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
}
_SINK_KEYS = {"service.url", "topic"}
_SPARK_KEYS = {"checkpointlocation", "path"}
"""Options of the query itself that Spark also hands to the data source."""


@dataclass(frozen=True)
class SourceOptions:
    """What to read and how, checked for one kind of query (batch or streaming)."""

    service_url: str
    """``service.url``: the Pulsar service URL."""
    topics: tuple[str, ...]
    """Full names of the topics given by ``topic`` or ``topics``, sorted."""
    starting: Bound
    """``startingOffsets``; a message id given here is included."""
    ending: Bound
    """``endingOffsets`` (batch only); a message id given here is included."""
    starting_time: int | None = None
    """``startingTime``: only messages published at or after this time (ms)."""
    ending_time: int | None = None
    """``endingTime`` (batch only): only messages published before this time (ms)."""
    fail_on_data_loss: bool = True
    """``failOnDataLoss``: fail when a range cannot be read to its end (default true)."""
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    """``pollTimeoutMs``: longest wait for a message known to exist."""
    max_records_per_trigger: int | None = None
    """``maxRecordsPerTrigger`` (streaming): most messages per micro-batch."""
    client_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.client.*`` settings, by their Java client names."""
    receiver_queue_size: int = 1000
    """``pulsar.reader.receiverQueueSize``: messages each reader prefetches."""


@dataclass(frozen=True)
class SinkOptions:
    """Where to write."""

    service_url: str
    """``service.url``: the Pulsar service URL."""
    topic: str | None
    """``topic``: the topic of every row; None means each row's ``__topic`` column."""
    client_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.client.*`` settings, by their Java client names."""


def parse_source_options(options: Mapping[str, str], mode: Mode) -> SourceOptions:
    """Check the options of ``spark.read`` (``mode="batch"``) or ``spark.readStream``."""
    opts = {key.lower(): value for key, value in options.items()}
    client_conf = _pass_through(opts, _SOURCE_KEYS, reading=True)
    if "topicspattern" in opts:
        raise InvalidOptionError(
            "topicsPattern is not supported: the Python Pulsar client cannot list a "
            "namespace's topics; name them in 'topics' (comma-separated) instead"
        )
    topics = _topics(opts)
    starting_time = _time(opts, "startingTime")
    ending_time = _time(opts, "endingTime")
    if starting_time is not None and "startingoffsets" in opts:
        raise InvalidOptionError("set startingOffsets or startingTime, not both")
    if ending_time is not None and "endingoffsets" in opts:
        raise InvalidOptionError("set endingOffsets or endingTime, not both")
    default_start = EARLIEST if mode == "batch" or starting_time is not None else LATEST
    starting = _bound(opts, "startingOffsets", topics, default_start)
    if mode == "batch":
        ending = _bound(opts, "endingOffsets", topics, LATEST)
        if starting == LATEST:
            raise InvalidOptionError(
                "startingOffsets='latest' is not allowed in a batch query: it would read "
                "nothing; use 'earliest' or JSON message ids"
            )
        if ending == EARLIEST:
            raise InvalidOptionError(
                "endingOffsets='earliest' is not allowed in a batch query: it would read "
                "nothing; use 'latest' or JSON message ids"
            )
        max_records = None  # a rate limit means nothing to one batch read
    else:
        for option in ("endingOffsets", "endingTime"):
            if option.lower() in opts:
                raise InvalidOptionError(
                    f"{option} is not allowed in a streaming query, which reads until it is "
                    "stopped; use Trigger.AvailableNow to stop at the messages there now"
                )
        ending = LATEST
        max_records = _positive_int(opts, "maxRecordsPerTrigger")
    poll_timeout_ms = _positive_int(opts, "pollTimeoutMs")
    receiver_queue_size = _positive_int(opts, _READER_PREFIX + "receiverQueueSize")
    return SourceOptions(
        service_url=_service_url(opts),
        topics=topics,
        starting=starting,
        ending=ending,
        starting_time=starting_time,
        ending_time=ending_time,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        poll_timeout_ms=poll_timeout_ms or DEFAULT_POLL_TIMEOUT_MS,
        max_records_per_trigger=max_records,
        client_conf=client_conf,
        receiver_queue_size=receiver_queue_size or DEFAULT_RECEIVER_QUEUE_SIZE,
    )


def check_read_options(options: Mapping[str, str], streaming: bool = False) -> None:
    """Raise :class:`InvalidOptionError` for read options Spark would reject when it plans
    the query, before anything starts."""
    parse_source_options(options, "stream" if streaming else "batch")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Check the options of ``df.write`` / ``df.writeStream``."""
    opts = {key.lower(): value for key, value in options.items()}
    client_conf = _pass_through(opts, _SINK_KEYS, reading=False)
    topic = opts.get("topic")
    return SinkOptions(
        service_url=_service_url(opts),
        topic=_topic_name("topic", topic) if topic else None,
        client_conf=client_conf,
    )


def _pass_through(opts: Mapping[str, str], known: set[str], reading: bool) -> dict[str, str]:
    """The ``pulsar.client.*`` settings; anything unknown is rejected."""
    client: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith(_CLIENT_PREFIX):
            client[_known(key, _CLIENT_PREFIX, _CLIENT_KEYS)] = value
        elif key.startswith(_READER_PREFIX) and reading:
            _known(key, _READER_PREFIX, _READER_KEYS)
        elif key not in known and key not in _SPARK_KEYS:
            extra = [_CLIENT_PREFIX + "*"] + ([_READER_PREFIX + "*"] if reading else [])
            raise InvalidOptionError(
                f"unknown option {key!r}; accepted {'reading' if reading else 'writing'}: "
                f"{', '.join(sorted(known) + extra)}"
            )
    return client


def _known(key: str, prefix: str, names: Mapping[str, str]) -> str:
    name = names.get(key[len(prefix) :])
    if name is None:
        accepted = ", ".join(prefix + n for n in sorted(names.values()))
        raise InvalidOptionError(f"unknown option {key!r}; accepted: {accepted}")
    return name


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


def _topics(opts: Mapping[str, str]) -> tuple[str, ...]:
    given = [key for key in ("topic", "topics") if key in opts]
    if len(given) != 1:
        what = "neither" if not given else "both"
        raise InvalidOptionError(
            f"set exactly one of the options topic, topics (comma-separated); got {what}"
        )
    names = [name.strip() for name in opts[given[0]].split(",")]
    if given[0] == "topic" and len(names) > 1:
        raise InvalidOptionError("option topic names one topic; use 'topics' for several")
    if not all(names):
        raise InvalidOptionError(f"option {given[0]} has an empty topic name: {opts[given[0]]!r}")
    return tuple(sorted({_topic_name(given[0], name) for name in names}))


def _topic_name(option: str, name: str) -> str:
    try:
        return full_topic_name(name)
    except ValueError as error:
        raise InvalidOptionError(f"option {option}: {error}") from None


def _bound(opts: Mapping[str, str], option: str, topics: tuple[str, ...], default: str) -> Bound:
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
    return {topic: as_position(message_id) for topic, message_id in ids.items()}


def _time(opts: Mapping[str, str], option: str) -> int | None:
    text = opts.get(option.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidOptionError(
            f"{option} must be a publish time in milliseconds since the epoch, got {text!r}"
        )
    return value


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
