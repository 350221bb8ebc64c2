"""What an update does to a function's config, by Apache Pulsar's rules
(FunctionConfigUtils.validateUpdate).

An update names only what changes. Some fields replace the current value when given (class
name, output, log topic, user config, secrets, parallelism, retries, dead-letter topic,
timeout, resources, ...); some may not change at all (processing guarantees, ordering,
runtime, auto-ack, subscription name, the output SerDe); inputs may be re-specified (a
topic's SerDe, say) but not added; every other field is left as it was. A refusal is a 400
with Pulsar's reason.
"""

from __future__ import annotations

from typing import Any

from pydantic.alias_generators import to_camel

from magnetar.instance.config import FunctionConfig
from magnetar.topics import full_topic_name
from magnetar.worker.exceptions import RequestRefusedError
from magnetar.worker.function_config import DEFAULT_RESOURCES

__all__ = ["changes_anything", "merge_update", "unknown_fields"]

_REPLACED_WHEN_SET = ("className", "logTopic", "output", "deadLetterTopic")
"""Replaced by a non-empty value. (``py`` and ``js`` name the code package: they change with
new code only.)"""
_REPLACED_WHEN_GIVEN = (
    "userConfig",
    "secrets",
    "maxMessageRetries",
    "parallelism",
    "timeoutMs",
    "cleanupSubscription",
    "producerConfig",
    "windowConfig",
    "urlBindings",
)
"""Replaced by any value but null."""
_REPLACED_WHEN_NOT_BLANK = ("runtimeFlags", "customRuntimeOptions")
_FIXED = (
    ("processingGuarantees", "Processing Guarantees cannot be altered"),
    ("retainOrdering", "Retain Ordering cannot be altered"),
    ("retainKeyOrdering", "Retain Key Ordering cannot be altered"),
    ("runtime", "Runtime cannot be altered"),
    ("autoAck", "AutoAck cannot be altered"),
)
"""Given with another value than the current one: refused."""
_INPUTS = ("inputs", "topicsPattern", "customSerdeInputs", "customSchemaInputs", "inputSpecs")


def unknown_fields(config: dict[str, Any]) -> list[str]:
    """The keys of ``config`` that are no FunctionConfig field (by Pulsar's name or ours)."""
    known = set()
    for name, field in FunctionConfig.model_fields.items():
        known |= {name, field.alias or to_camel(name)}
    return sorted(key for key in config if key not in known)


def merge_update(existing: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """The config ``update`` turns ``existing`` into (both in Pulsar's field names)."""
    current = FunctionConfig.parse(existing)
    merged = dict(existing)
    for field in _REPLACED_WHEN_SET:
        if update.get(field):
            merged[field] = update[field]
    for field in _REPLACED_WHEN_GIVEN:
        if update.get(field) is not None:
            merged[field] = update[field]
    for field in _REPLACED_WHEN_NOT_BLANK:
        value = update.get(field)
        if isinstance(value, str) and value.strip():
            merged[field] = value
    if isinstance(update.get("resources"), dict):
        merged["resources"] = {**(existing.get("resources") or {}), **update["resources"]}
    for field, refusal in _FIXED:
        value = update.get(field)
        if value is not None and _normalized(field, value) != _normalized(
            field, current.model_dump(by_alias=True)[field]
        ):
            raise RequestRefusedError(refusal)
    serde = update.get("outputSerdeClassName")
    if serde and serde != current.output_serde_class_name:
        raise RequestRefusedError("Output Serde mismatch")
    schema = update.get("outputSchemaType")
    if schema and schema != existing.get("outputSchemaType"):
        raise RequestRefusedError("Output Schema mismatch")
    sub_name = update.get("subName")
    if sub_name and sub_name != current.sub_name:
        raise RequestRefusedError("Subscription Name cannot be altered")
    specs = _input_specs(update)
    if specs:
        respecified = _respecified(current, specs)
        merged["inputSpecs"] = {**(existing.get("inputSpecs") or {}), **respecified}
    return merged


def changes_anything(existing: dict[str, Any], merged: dict[str, Any]) -> bool:
    """Whether ``merged`` configures the function differently from ``existing`` (however
    each spells its inputs)."""
    return _canonical(FunctionConfig.parse(existing)) != _canonical(FunctionConfig.parse(merged))


def _canonical(config: FunctionConfig) -> dict[str, Any]:
    inputs = {"inputs", "topics_pattern", "custom_serde_inputs", "input_specs"}
    specs = {}
    for topic, spec in config.input_specs.items():
        extra = spec.model_dump(exclude_defaults=True, exclude={"serde_class_name", "is_regex"})
        # as ``get`` answers them: empty properties, messages not pooled
        extra = {field: value for field, value in extra.items() if value not in ({}, False)}
        if extra:
            specs[topic if spec.is_regex else full_topic_name(topic)] = extra
    producer = config.producer_config.model_dump() if config.producer_config else {}
    return {
        **config.model_dump(exclude=inputs | {"resources", "producer_config", "batch_builder"}),
        # unset as ``get`` answers it: Pulsar's defaults, a blank batch builder
        "resources": {**DEFAULT_RESOURCES, **(config.resources or {})},
        "cleanup_subscription": config.cleanup_subscription is not False,
        "producer": {field: value for field, value in producer.items() if value},
        "batch_builder": config.batch_builder or None,
        "inputSerdes": config.input_serdes(),
        "patterns": sorted(config.input_patterns()),
        "specs": specs,
    }


def _normalized(field: str, value: Any) -> Any:
    return value.upper() if field == "runtime" and isinstance(value, str) else value


def _input_specs(update: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The inputs an update names, as inputSpecs entries (as Pulsar folds them together)."""
    for field in _INPUTS:
        value = update.get(field)
        expected = {"inputs": list, "topicsPattern": str}.get(field, dict)
        if value is not None and not isinstance(value, expected):
            raise RequestRefusedError(
                f"invalid function config: {field}: must be a "
                f"{ {list: 'list', str: 'string', dict: 'mapping'}[expected] }"
            )
    specs: dict[str, dict[str, Any]] = {}
    for topic in update.get("inputs") or []:
        specs[str(topic)] = {"isRegexPattern": False}
    if update.get("topicsPattern"):
        specs[update["topicsPattern"]] = {"isRegexPattern": True}
    for topic, serde in (update.get("customSerdeInputs") or {}).items():
        specs[str(topic)] = {"serdeClassName": serde, "isRegexPattern": False}
    for topic, schema in (update.get("customSchemaInputs") or {}).items():
        specs[str(topic)] = {"schemaType": schema, "isRegexPattern": False}
    for topic, spec in (update.get("inputSpecs") or {}).items():
        specs[str(topic)] = spec if isinstance(spec, dict) else {}
    return specs


def _respecified(current: FunctionConfig, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``specs`` checked against the inputs ``current`` has: the same topics (or patterns),
    each still a topic or still a pattern."""
    patterns = set(current.input_patterns())
    topics = set(current.input_serdes())
    for topic, spec in specs.items():
        regex = any(spec.get(f) for f in ("isRegexPattern", "regexPattern", "isRegex"))
        if topic in patterns:
            known_regex = True
        else:
            try:
                name = full_topic_name(topic)
            except ValueError:
                name = topic
            if name not in topics:
                raise RequestRefusedError("Input Topics cannot be altered")
            known_regex = False
        if regex != known_regex:
            raise RequestRefusedError(f"isRegexPattern for input topic {topic} cannot be altered")
    return specs
