"""The FunctionConfig ``functions get`` answers: the one Apache Pulsar's worker answers for
the same create (``FunctionConfigUtils.convertFromDetails`` of the details it stored), with
Pulsar's defaults filled in, and after it the fields as sent that Pulsar's answer leaves out
(``inputs``, ``py`` or ``js``, ...), so nothing a user gave is hidden.

Pulsar's answer spells every input as an ``inputSpecs`` entry (the ``inputs``,
``topicsPattern``, ``customSerdeInputs`` and ``customSchemaInputs`` folded in), gives the
default resources (1 CPU, 1 GiB RAM, 10 GiB disk) and a ``producerConfig``, and says
``runtime``, ``autoAck``, ``retainOrdering``, ``retainKeyOrdering``, ``cleanupSubscription``,
``subscriptionPosition`` and ``forwardSourceMessageProperty`` whether or not they were sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from magnetar.instance.config import ConsumerSpec, FunctionConfig
from magnetar.instance.exceptions import InvalidFunctionConfigError

__all__ = ["DEFAULT_RESOURCES", "pulsar_function_config"]

DEFAULT_RESOURCES: dict[str, Any] = {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240}
"""Pulsar's ``Resources.getDefaultResources()``, which its worker stores when none are given."""


def pulsar_function_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The FunctionConfig JSON of a stored ``config`` (Pulsar's field names), as Pulsar's
    worker answers it, then the sent fields Pulsar's answer lacks."""
    try:
        parsed = FunctionConfig.parse(dict(config))
    except InvalidFunctionConfigError:
        # stored by a release whose checks were looser: shown as it was sent
        return {field: value for field, value in config.items() if value is not None}
    answer: dict[str, Any] = {
        "tenant": parsed.tenant,
        "namespace": parsed.namespace,
        "name": parsed.name,
        "className": parsed.class_name,
        "inputSpecs": _input_specs(parsed),
        "output": parsed.output,
        "producerConfig": _producer_config(parsed),
        "outputSchemaType": parsed.output_schema_type,
        "outputSerdeClassName": parsed.output_serde_class_name,
        "logTopic": parsed.log_topic,
        "processingGuarantees": parsed.processing_guarantees.value,
        "retainOrdering": parsed.retain_ordering,
        "retainKeyOrdering": parsed.retain_key_ordering,
        "forwardSourceMessageProperty": parsed.forward_source_message_property,
        "userConfig": dict(parsed.user_config),
        "secrets": dict(parsed.secrets) or None,
        "runtime": parsed.runtime.value,
        "autoAck": parsed.auto_ack,
        "maxMessageRetries": parsed.max_message_retries,
        "deadLetterTopic": parsed.dead_letter_topic,
        "subName": parsed.sub_name,
        "parallelism": parsed.parallelism,
        "resources": {**DEFAULT_RESOURCES, **(parsed.resources or {})},
        "windowConfig": _window_config(parsed),
        "timeoutMs": parsed.timeout_ms,
        "cleanupSubscription": (
            True if parsed.cleanup_subscription is None else parsed.cleanup_subscription
        ),
        "runtimeFlags": parsed.runtime_flags or None,
        "customRuntimeOptions": parsed.custom_runtime_options or None,
        "subscriptionPosition": parsed.subscription_position.value,
    }
    # Pulsar leaves unset fields out (its JSON has no nulls)
    answer = {field: value for field, value in answer.items() if value is not None}
    for field, value in config.items():
        if value is not None:
            answer.setdefault(field, value)
    return answer


def _input_specs(config: FunctionConfig) -> dict[str, dict[str, Any]]:
    """Every input as a ConsumerConfig, folded together as Pulsar's worker does."""
    specs: dict[str, ConsumerSpec] = {topic: ConsumerSpec() for topic in config.inputs}
    if config.topics_pattern:
        specs[config.topics_pattern] = ConsumerSpec(is_regex=True)
    for topic, serde in config.custom_serde_inputs.items():
        specs[topic] = ConsumerSpec(serde_class_name=serde)
    for topic, schema in config.custom_schema_inputs.items():
        specs[topic] = ConsumerSpec(schema_type=schema)
    specs.update(config.input_specs)
    return {topic: _consumer_config(spec) for topic, spec in specs.items()}


def _consumer_config(spec: ConsumerSpec) -> dict[str, Any]:
    """Pulsar's ConsumerConfig JSON (its ``isRegexPattern`` field reads ``regexPattern``
    there, as Jackson names a boolean's ``is`` getter)."""
    answer: dict[str, Any] = {
        "schemaType": spec.schema_type,
        "serdeClassName": spec.serde_class_name,
        "regexPattern": spec.is_regex,
        "schemaProperties": dict(spec.schema_properties or {}),
        "consumerProperties": dict(spec.consumer_properties or {}),
        "receiverQueueSize": spec.receiver_queue_size,
        "cryptoConfig": spec.crypto_config,
        "messagePayloadProcessorConfig": spec.message_payload_processor_config,
        "poolMessages": bool(spec.pool_messages),
    }
    return {field: value for field, value in answer.items() if value is not None}


def _producer_config(config: FunctionConfig) -> dict[str, Any]:
    """Pulsar's ProducerConfig as its worker gives it back: always the batch builder (blank
    when unset) and whether producers are thread-local."""
    spec = config.producer_config
    answer: dict[str, Any] = {
        "maxPendingMessages": spec.max_pending_messages if spec else None,
        "maxPendingMessagesAcrossPartitions": (
            spec.max_pending_messages_across_partitions if spec else None
        ),
        "useThreadLocalProducers": bool(spec and spec.use_thread_local_producers),
        "cryptoConfig": spec.crypto_config if spec else None,
        "batchBuilder": (spec.batch_builder if spec else None) or config.batch_builder or "",
        "batchingConfig": spec.batching_config if spec else None,
        "compressionType": spec.compression_type if spec else None,
    }
    return {field: value for field, value in answer.items() if value is not None}


def _window_config(config: FunctionConfig) -> dict[str, Any] | None:
    """The window config with Pulsar's defaults and the window function's class, as
    ``WindowConfigUtils.inferMissingArguments`` fills them in."""
    if config.window_config is None:
        return None
    window = config.window_config.model_dump(by_alias=True, exclude_none=True)
    return {"actualWindowFunctionClassName": config.class_name, **window}
