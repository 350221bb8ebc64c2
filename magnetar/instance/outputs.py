"""The instance's producers: the output topic (one producer per input partition under
EFFECTIVELY_ONCE), ``context.publish`` topics, the state journal and the dead-letter topic,
one producer per topic; and what an output message carries."""

from __future__ import annotations

import base64
import logging
import threading
from typing import Any

import pulsar

from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
from magnetar.instance.exceptions import InstanceError
from magnetar.instance.options import InstanceOptions
from magnetar.instance.output_sequence import sequence_id
from magnetar.instance.partition_outputs import PartitionOutputs
from magnetar.topics import full_topic_name

__all__ = ["INPUT_MSG_ID", "INPUT_TOPIC", "Outputs", "holds_batches"]

log = logging.getLogger(__name__)

_COMPRESSION = {
    "NONE": pulsar.CompressionType.NONE,
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}
_BATCHING_CONFIG = {
    "enabled": "batching_enabled",
    "batchingMaxPublishDelayMs": "batching_max_publish_delay_ms",
    "batchingMaxMessages": "batching_max_messages",
    "batchingMaxBytes": "batching_max_allowed_size_in_bytes",
}
"""PIP-401's ``producerConfig.batchingConfig`` fields -> the Python producer's settings."""
INPUT_TOPIC = "__pfn_input_topic__"
INPUT_MSG_ID = "__pfn_input_msg_id__"


class Outputs:
    """Producers by topic, created on first use."""

    def __init__(
        self,
        client: pulsar.Client,
        config: FunctionConfig,
        options: InstanceOptions,
        stopping: threading.Event,
        output_schema: Any = None,
    ) -> None:
        """``stopping``: set when the instance stops (ends a wait for a busy producer name);
        ``output_schema``: the schema the output producer declares (see ``schemas``)."""
        self._client = client
        self._options = options
        self._forward_properties = config.forward_source_message_property
        effectively_once = config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
        self._sequence_ids = effectively_once
        self._producers: dict[str, Any] = {}
        settings = _output_settings(config, output_schema)
        self._by_partition: PartitionOutputs | None = None
        self.output: Any = None
        """The output topic's producer; None when the function has no output, or has one per
        input partition (EFFECTIVELY_ONCE)."""
        if config.output and effectively_once and options.broker_may_deduplicate:
            output = full_topic_name(config.output)
            self._by_partition = PartitionOutputs(
                # Unbatched, for the broker's deduplication (see partition_outputs). Without a
                # send timeout, as Apache Pulsar's instances send: a send that timed out could
                # be followed by later ones stored first, and its output, sent again, would be
                # dropped; a producer that loses its connection sends again, in order.
                lambda name: self._new_producer(
                    output,
                    producer_name=name,
                    **{**settings, "batching_enabled": False, "send_timeout_millis": 0},
                ),
                stopping,
                options.output_producer_idle_s,
                # what may be unacknowledged, and so sent again, at once
                options.max_unacked + options.receiver_queue_size,
            )
        elif config.output:
            self.output = self.producer(config.output, **settings)

    def output_for(self, input_topic: str) -> Any:
        """The producer of the results of inputs from ``input_topic`` (a topic partition);
        None when the function has no output."""
        if self._by_partition is not None:
            return self._by_partition.producer(input_topic)
        return self.output

    def timer_lane(self, name: str) -> Any:
        """The output producer named ``name`` for a lane of timer firings, or None while
        another producer holds the name (see ``timer_once``)."""
        assert self._by_partition is not None
        return self._by_partition.try_producer(name)

    @property
    def deduplicated(self) -> bool:
        """Outputs go through named producers with sequence ids (EFFECTIVELY_ONCE on a
        broker that may deduplicate)."""
        return self._by_partition is not None

    def close_idle(self) -> None:
        """Let go of the output producers of input partitions that went quiet (see
        ``partition_outputs``)."""
        if self._by_partition is not None:
            self._by_partition.close_idle()

    def producer(self, topic: str, **settings: Any) -> Any:
        """The producer for ``topic`` (a short or full name)."""
        full = full_topic_name(topic)
        producer = self._producers.get(full)
        if producer is None:
            producer = self._producers[full] = self._new_producer(full, **settings)
        return producer

    def _new_producer(self, full: str, **settings: Any) -> Any:
        options = self._options
        kwargs: dict[str, Any] = {
            "batching_enabled": True,
            "batching_max_publish_delay_ms": options.batching_max_publish_delay_ms,
            "block_if_queue_full": True,
            "max_pending_messages": 2 * options.max_unacked,
            "send_timeout_millis": options.send_timeout_ms,
            **settings,
        }
        try:
            return self._client.create_producer(full, **kwargs)
        except pulsar.ProducerBusy:
            raise
        except Exception as error:
            raise InstanceError(f"cannot create a producer on {full}: {error}") from error

    def result_kwargs(
        self, message: Any, message_id: Any, topic: str, sequenced: bool = True
    ) -> dict[str, Any]:
        """How the result of ``message`` is sent: its event time and properties, and the
        input's topic and id (``trigger`` finds the result by them). Without the input's key,
        as Apache Pulsar's Python runtime sends it. ``sequenced``: with the sequence id of
        its input's output under EFFECTIVELY_ONCE (taken: only for a result that is sent)."""
        properties = dict(message.properties()) if self._forward_properties else {}
        properties[INPUT_TOPIC] = topic
        properties[INPUT_MSG_ID] = base64.b64encode(message_id.serialize()).decode()
        kwargs: dict[str, Any] = {"properties": properties}
        event_time = message.event_timestamp()
        if event_time:
            kwargs["event_timestamp"] = event_time
        if not (sequenced and self._sequence_ids):
            return kwargs
        if self._by_partition is not None:
            kwargs["sequence_id"] = self._by_partition.sequence_id(topic, message_id)
        else:
            kwargs["sequence_id"] = sequence_id(message_id)
        return kwargs

    def flush(self) -> None:
        """Send what every producer still batches (on stop)."""
        producers = list(self._producers.values())
        if self._by_partition is not None:
            producers += self._by_partition.producers()
        for producer in producers:
            try:
                producer.flush()
            except Exception as error:
                log.warning("flushing %s on stop failed: %s", producer.topic(), error)

    def close(self) -> None:
        if self._by_partition is not None:
            self._by_partition.close()
        for producer in self._producers.values():
            try:
                producer.close()
            except Exception as error:
                log.debug("closing a producer failed: %s", error)
        self._producers.clear()


def _output_settings(config: FunctionConfig, schema: Any) -> dict[str, Any]:
    """The output producer's settings from ``producerConfig``, ``batchBuilder`` and the
    output's schema."""
    spec = config.producer_config
    settings: dict[str, Any] = {"schema": schema} if schema is not None else {}
    builder = (spec.batch_builder if spec else None) or config.batch_builder
    if builder and builder.upper() == "KEY_BASED":
        settings["batching_type"] = pulsar.BatchingType.KeyBased
    if spec is not None and spec.compression_type:
        settings["compression_type"] = _COMPRESSION[spec.compression_type.upper()]
    if spec is not None and spec.max_pending_messages:
        settings["max_pending_messages"] = spec.max_pending_messages
    batching = (spec.batching_config if spec else None) or {}
    for field, setting in _BATCHING_CONFIG.items():
        if batching.get(field) is not None:
            settings[setting] = batching[field]
    return settings


def holds_batches(config: FunctionConfig) -> bool:
    """Whether the user set the output's batching (PIP-401's ``batchingConfig``): then
    batches wait for their delay as asked, rather than going out when no input waits."""
    spec = config.producer_config
    return bool(spec and spec.batching_config)
