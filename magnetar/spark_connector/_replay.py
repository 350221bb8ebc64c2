"""Replaying a function over a stretch of a topic's history, on Spark.

The function's code is loaded on the executors exactly as a function instance loads it
(``magnetar.instance.load_function``), deserialized and serialized with the same SerDes,
and called with a real ``InstanceContext`` pointed at each message. Its return values come
out as messages with the event time and properties the live instance would give them
(input properties plus ``__pfn_input_topic__`` and ``__pfn_input_msg_id__``; no key, as
Apache's Python runtime sends none); messages it
publishes through the context come out with their own topics.

Differences from a live instance, by design: nothing is acknowledged; state is not
configured (state calls raise, and count as user exceptions); a message whose processing
raises is counted and reported, not retried, and the replay goes on; publish callbacks are
called with ``Result.Ok`` as soon as the message is collected.
"""

from __future__ import annotations

import base64
import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
from pyspark import SparkFiles
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import Row, SparkSession
from pyspark.sql.types import StructType

from magnetar.instance import (
    ClearTextSecretsProvider,
    FunctionConfig,
    InstanceContext,
    LoadedFunction,
    SerDeError,
    UnconfiguredStateStore,
    load_function,
    load_serde,
)
from magnetar.instance.metrics import InstanceMetrics
from magnetar.spark_connector._files import write_files
from magnetar.spark_connector._options import check_read_options
from magnetar.spark_connector._schema import (
    EVENT_TIME,
    KEY,
    MESSAGE_ID,
    PROPERTIES,
    SCHEMA,
    TOPIC,
    millis,
)
from magnetar.spark_connector._source import PulsarDataSource
from magnetar.spark_connector.exceptions import ReplayError
from magnetar.topics import full_topic_name

__all__ = ["REPLAY_SCHEMA", "ReplayProgress", "ReplayReport", "replay"]

_INPUT_TOPIC = "__pfn_input_topic__"
_INPUT_MSG_ID = "__pfn_input_msg_id__"
_KEPT_EXCEPTIONS = 10

REPLAY_SCHEMA = StructType([SCHEMA[name] for name in ("value", KEY, TOPIC, EVENT_TIME, PROPERTIES)])
"""Columns of a replay's output: what the Pulsar writer takes. ``__topic`` is the topic a
return value goes to (``to_topic``, else the function's output topic, possibly null), or
the topic a message was published to."""


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did."""

    inputs: int
    """Input messages the function was called with (or that failed to deserialize)."""
    outputs: int
    """Return values written (None returns nothing, as live)."""
    published: int
    """Messages the function published through ``context.publish``."""
    user_exceptions: int
    """Inputs whose processing raised; they produced nothing."""
    system_exceptions: int
    """Inputs that could not be deserialized, or whose result could not be serialized."""
    latest_exceptions: tuple[str, ...]
    """Up to ten of those failures: the message id, topic and error."""


@dataclass(frozen=True)
class ReplayProgress:
    """Progress of a running replay, as reported to a ``progress`` callback."""

    tasks_done: int
    tasks_total: int
    inputs: int
    """Inputs processed by finished tasks."""


def replay(
    spark: SparkSession,
    config: FunctionConfig,
    read_options: Mapping[str, str],
    *,
    to_topic: str | None = None,
    path: str | None = None,
    file_format: str = "parquet",
    progress: Callable[[ReplayProgress], None] | None = None,
    progress_interval_s: float = 2.0,
) -> ReplayReport:
    """Run the function of ``config`` over the messages ``read_options`` select.

    ``read_options`` are those of the ``pulsar`` data source (``service.url``,
    ``startingOffsets``, ``endingOffsets``, ...); without ``topic``/``topics`` the
    function's inputs are read. Exactly one of ``to_topic`` (write the results to Pulsar:
    return values to ``to_topic``, publishes to their own topics) and ``path`` (write
    ``file_format`` files there) must be given.
    """
    if (to_topic is None) == (path is None):
        raise ReplayError("give exactly one destination: to_topic (Pulsar) or path (files)")
    if not config.py:
        raise ReplayError(f"function {config.fqfn} has no code: set py (--py)")
    code = Path(config.py).expanduser().resolve()
    if not code.is_file():
        raise ReplayError(f"function file {config.py} does not exist")
    load_function(code, config.class_name)  # a broken function fails here, not in every task
    options = {key.lower(): value for key, value in read_options.items()}
    if not {"topic", "topics", "topicspattern"} & set(options):
        options["topics"] = ",".join(sorted(config.input_serdes()))
    # The function's SerDes decode the payloads, as live: read them as bytes.
    options["allowdifferenttopicschemas"] = "true"
    check_read_options(options)
    destination = to_topic or config.output
    try:
        output_topic = full_topic_name(destination) if destination else None
    except ValueError as error:
        raise ReplayError(f"output topic: {error}") from None

    spark.dataSource.register(PulsarDataSource)
    # Executors get the code the way Spark ships any file, so a cluster works as local does.
    spark.sparkContext.addFile(str(code))
    counters = _Counters.create(spark)
    job = _Job(config, code.name, output_topic)
    inputs = spark.read.format("pulsar").options(**options).load()
    rows = inputs.rdd.mapPartitions(lambda part: _replay_partition(part, job, counters))
    results = spark.createDataFrame(rows, REPLAY_SCHEMA)

    watcher = _Watcher(spark, counters, progress, progress_interval_s) if progress else None
    try:
        if to_topic is not None:
            (
                results.write.format("pulsar")
                .option("service.url", options["service.url"])
                .options(**{k: v for k, v in options.items() if k.startswith("pulsar.client.")})
                .mode("append")
                .save()
            )
        else:
            assert path is not None
            write_files(results, path, file_format)
    finally:
        if watcher is not None:
            watcher.stop()
    return counters.report()


@dataclass(frozen=True)
class _Job:
    """What every task needs, shipped to the executors."""

    config: FunctionConfig
    code_file: str
    output_topic: str | None


class _FirstExceptions(AccumulatorParam[list[str]]):
    """Keeps the first few failure descriptions."""

    def zero(self, value: list[str]) -> list[str]:
        return []

    def addInPlace(self, value1: list[str], value2: list[str]) -> list[str]:
        return (value1 + value2)[:_KEPT_EXCEPTIONS]


@dataclass(frozen=True)
class _Counters:
    """Accumulators: added to by tasks, read on the driver."""

    inputs: Accumulator[int]
    outputs: Accumulator[int]
    published: Accumulator[int]
    user_exceptions: Accumulator[int]
    system_exceptions: Accumulator[int]
    exceptions: Accumulator[list[str]]

    @classmethod
    def create(cls, spark: SparkSession) -> _Counters:
        sc = spark.sparkContext
        return cls(
            inputs=sc.accumulator(0),
            outputs=sc.accumulator(0),
            published=sc.accumulator(0),
            user_exceptions=sc.accumulator(0),
            system_exceptions=sc.accumulator(0),
            exceptions=sc.accumulator([], _FirstExceptions()),
        )

    def report(self) -> ReplayReport:
        return ReplayReport(
            inputs=self.inputs.value,
            outputs=self.outputs.value,
            published=self.published.value,
            user_exceptions=self.user_exceptions.value,
            system_exceptions=self.system_exceptions.value,
            latest_exceptions=tuple(self.exceptions.value),
        )


class _Watcher:
    """Reports progress from the driver while the replay's Spark job runs."""

    def __init__(
        self,
        spark: SparkSession,
        counters: _Counters,
        progress: Callable[[ReplayProgress], None],
        interval_s: float,
    ) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._counters = counters
        self._progress = progress
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replay-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            stages = [self._tracker.getStageInfo(s) for s in self._tracker.getActiveStageIds()]
            known = [s for s in stages if s is not None]
            self._progress(
                ReplayProgress(
                    tasks_done=sum(s.numCompletedTasks for s in known),
                    tasks_total=sum(s.numTasks for s in known),
                    inputs=self._counters.inputs.value,
                )
            )

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


# --- executors ------------------------------------------------------------------------------

_REPLAYERS: dict[tuple[str, str], _Replayer] = {}
"""Loaded functions of this Python worker, reused by its later tasks (workers are reused)."""


def _replay_partition(
    rows: Iterable[Row], job: _Job, counters: _Counters
) -> Iterator[tuple[Any, ...]]:
    key = (job.code_file, job.config.model_dump_json())
    replayer = _REPLAYERS.get(key)
    if replayer is None:
        replayer = _REPLAYERS[key] = _Replayer(job)
    tally = _Tally()
    try:
        for row in rows:
            yield from replayer.run(row, tally)
    finally:
        counters.inputs.add(tally.inputs)
        counters.outputs.add(tally.outputs)
        counters.published.add(tally.published)
        counters.user_exceptions.add(tally.user_exceptions)
        counters.system_exceptions.add(tally.system_exceptions)
        counters.exceptions.add(tally.exceptions)


@dataclass
class _Tally:
    inputs: int = 0
    outputs: int = 0
    published: int = 0
    user_exceptions: int = 0
    system_exceptions: int = 0
    exceptions: list[str] = field(default_factory=list)

    def failed(self, text: str, system: bool) -> None:
        if system:
            self.system_exceptions += 1
        else:
            self.user_exceptions += 1
        if len(self.exceptions) < _KEPT_EXCEPTIONS:
            self.exceptions.append(text)


class _ReplayedMessage:
    """The parts of a ``pulsar.Message`` the Context reads, from a row of a Pulsar read."""

    def __init__(self, row: Row) -> None:
        self._row = row

    def message_id(self) -> Any:
        return pulsar.MessageId.deserialize(self._row[MESSAGE_ID])

    def partition_key(self) -> str:
        key = self._row[KEY]
        return key.decode() if key else ""

    def event_timestamp(self) -> int:
        event_time = self._row[EVENT_TIME]
        return millis(event_time) if event_time else 0

    def properties(self) -> dict[str, str]:
        return dict(self._row[PROPERTIES] or {})

    def ordering_key(self) -> None:
        return None  # not a column of a Pulsar read


class _Collector:
    """The context's publisher: collects published messages as output rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def publish(
        self,
        topic: str,
        payload: bytes,
        message_conf: dict[str, Any],
        callback: Callable[[Any, Any], None] | None,
    ) -> None:
        key = message_conf.get("partition_key")
        event_ms = message_conf.get("event_timestamp")
        self.rows.append(
            (
                payload,
                key.encode() if key else None,
                full_topic_name(topic),
                _datetime(event_ms) if event_ms else None,
                dict(message_conf.get("properties") or {}),
            )
        )
        if callback is not None:
            callback(pulsar.Result.Ok, None)

    def ack(self, message_id: Any, topic: str) -> None:
        """A replay acknowledges nothing: it reads, it does not subscribe."""


class _Replayer:
    """One loaded function and its context, in one executor process."""

    def __init__(self, job: _Job) -> None:
        config = job.config
        self._config = config
        self._output_topic = job.output_topic
        self._function: LoadedFunction = load_function(
            SparkFiles.get(job.code_file), config.class_name
        )
        paths = self._function.search_paths
        self._serdes = {
            topic: load_serde(name, paths) for topic, name in config.input_serdes().items()
        }
        self._default_serde = load_serde(None)
        self._output_serde = load_serde(config.output_serde_class_name, paths)
        self._collector = _Collector()
        self._context = InstanceContext(
            config,
            0,
            self._collector,
            InstanceMetrics(0),
            UnconfiguredStateStore(config.fqfn),
            ClearTextSecretsProvider(),  # the live function's default, as Apache's
            logging.getLogger(f"magnetar.function.{config.fqfn}.replay"),
            paths,
        )

    def run(self, row: Row, tally: _Tally) -> list[tuple[Any, ...]]:
        """The output rows of one input row."""
        tally.inputs += 1
        topic = row[TOPIC]
        message = _ReplayedMessage(row)
        where = f"message {_describe_id(row[MESSAGE_ID])} of {topic}"
        serde = self._serdes.get(topic, self._default_serde)
        try:
            value = serde.deserialize(bytes(row["value"]))
        except Exception as error:
            tally.failed(
                f"{where}: cannot deserialize with {type(serde).__name__}: {error!r}", True
            )
            return []
        self._context.set_message(message, topic)
        collected = self._collector.rows
        collected.clear()
        try:
            if self._function.takes_context:
                result = self._function.process(value, self._context)
            else:
                result = self._function.process(value)
            payload = None if result is None else self._output_serde.serialize(result)
        except Exception as error:
            tally.failed(f"{where}: {type(error).__name__}: {error}", isinstance(error, SerDeError))
            return []
        out = list(collected)
        tally.published += len(out)
        if payload is not None:
            tally.outputs += 1
            out.append(self._output_row(row, payload, message, topic))
        return out

    def _output_row(
        self, row: Row, payload: bytes, message: _ReplayedMessage, topic: str
    ) -> tuple[Any, ...]:
        """A return value with what the live instance gives it (``_output_kwargs``)."""
        properties = message.properties() if self._config.forward_source_message_property else {}
        properties[_INPUT_TOPIC] = topic
        properties[_INPUT_MSG_ID] = base64.b64encode(row[MESSAGE_ID]).decode()
        return (payload, None, self._output_topic, row[EVENT_TIME], properties)


def _datetime(millis: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(millis / 1000, tz=datetime.UTC)


def _describe_id(serialized: bytes) -> str:
    message_id = pulsar.MessageId.deserialize(serialized)
    return f"({message_id.ledger_id()}, {message_id.entry_id()}, {message_id.batch_index()})"
