"""The FunctionConfig flags of `pulsar-admin functions` (shared by localrun, create, update).

Flags become FunctionConfig fields (Pulsar's camelCase names) over a ``--function-config-file``
(JSON or YAML); only flags that were given count, so ``update`` changes just those fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # imported when used: `magnetar functions list` needs no pydantic
    from magnetar.instance.config import FunctionConfig

__all__ = [
    "config_fields",
    "config_from_flags",
    "function_config_options",
    "is_url",
    "with_default_name",
]

_URL_SCHEMES = ("http://", "https://", "file://", "function://", "source://", "sink://")
"""Besides http(s) and file: packages of Pulsar's package management (function://...)."""


def function_config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the FunctionConfig flags of pulsar-admin's ``functions create|update|localrun`` (all
    but the function's identity) to ``command``; deprecated camelCase spellings, which
    pulsar-admin still accepts, follow the current names."""
    options = [
        click.option(
            "--function-config-file",
            "--functionConfigFile",
            type=click.Path(dir_okay=False),
            help="JSON or YAML FunctionConfig; flags override its fields.",
        ),
        click.option(
            "--py", help="The function's .py file or .zip package (or an http(s)/file URL)."
        ),
        click.option(
            "--js", help="The function's .js script (runtime JAVASCRIPT), instead of --py."
        ),
        click.option("--jar", help="Refused: Java functions run on Apache Pulsar's own worker."),
        click.option("--go", help="Refused: Go functions run on Apache Pulsar's own worker."),
        click.option("-t", "--function-type", help="Refused: built-in Java functions (as --jar)."),
        click.option(
            "--classname",
            "--className",
            "class_name",
            help="module (its process), module.ClassName, package.module.ClassName or "
            "module.function; for --js, the script's function.",
        ),
        click.option("-i", "--inputs", help="Comma-separated input topics."),
        click.option("--topics-pattern", "--topicsPattern", help="Regex of input topics."),
        click.option("--input-specs", help="JSON map of input topic to ConsumerConfig."),
        click.option(
            "--custom-serde-inputs", "--customSerdeInputs", help="JSON map of input to SerDe."
        ),
        click.option(
            "--custom-schema-inputs",
            help="JSON map of input topic to schema type (STRING, BYTES, JSON, AVRO).",
        ),
        click.option(
            "--custom-schema-outputs", help="JSON map of topic to schema (kept, Java only)."
        ),
        click.option(
            "--input-type-class-name",
            help="module.Record class a JSON or AVRO input is decoded into.",
        ),
        click.option("-o", "--output", help="Output topic."),
        click.option(
            "--output-type-class-name", help="module.Record class of a JSON or AVRO output."
        ),
        click.option(
            "-st",
            "--schema-type",
            "output_schema_type",
            help="Output schema type (STRING, BYTES, JSON, AVRO), registered on the topic.",
        ),
        click.option(
            "--output-serde-classname",
            "--outputSerdeClassName",
            "output_serde_class_name",
            help="SerDe class for the output.",
        ),
        click.option(
            "--producer-config",
            help="JSON ProducerConfig of the output (maxPendingMessages, compressionType, "
            "batchBuilder).",
        ),
        click.option(
            "--batch-builder",
            type=click.Choice(["DEFAULT", "KEY_BASED"], case_sensitive=False),
            help="How outputs are batched [default: DEFAULT].",
        ),
        click.option(
            "--log-topic", "--logTopic", help="Topic the function's logs are published to."
        ),
        click.option("--parallelism", type=int, help="Number of instances [default: 1]."),
        click.option(
            "--processing-guarantees",
            "--processingGuarantees",
            type=click.Choice(["ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL"]),
            help="Delivery semantics [default: ATLEAST_ONCE].",
        ),
        click.option(
            "--user-config",
            "--userConfig",
            help="JSON map readable with context.get_user_config_value.",
        ),
        click.option(
            "--secrets", help="JSON map of secret name to what the secrets provider reads."
        ),
        click.option(
            "--url-bindings",
            help="JavaScript: JSON list of the HTTP endpoints curl() may call (alias, url, "
            "auth, timeoutMs, maxResponseBytes).",
        ),
        click.option("--subs-name", "sub_name", help="Subscription name [default: the FQFN]."),
        click.option(
            "--subs-position",
            "subscription_position",
            type=click.Choice(["Latest", "Earliest"]),
            help="Where a new subscription starts [default: Latest].",
        ),
        click.option(
            "--skip-to-latest",
            help="true: every start of an instance skips what arrived meanwhile.",
        ),
        click.option(
            "--retain-ordering",
            "--retainOrdering",
            is_flag=True,
            default=None,
            help="Process in order.",
        ),
        click.option(
            "--retain-key-ordering", is_flag=True, default=None, help="Process each key in order."
        ),
        click.option(
            "--forward-source-message-property",
            help="true or false: copy the input's properties to the output [default: true].",
        ),
        click.option(
            "--max-message-retries",
            type=int,
            help="Retries of a failing message before it goes to the dead-letter topic.",
        ),
        click.option("--dead-letter-topic", help="Topic for messages whose retries are used up."),
        click.option(
            "--max-pending-async-requests",
            type=click.IntRange(min=1),
            help="Most invocations of an async def process in flight [default: 1000].",
        ),
        click.option(
            "--timeout-ms",
            "--timeoutMs",
            type=int,
            help="Upper bound of one invocation, in ms.",
        ),
        click.option("--auto-ack", "--autoAck", help="true or false [default: true]."),
        click.option(
            "--cleanup-subscription",
            help="true or false: delete the subscription with the function [default: true].",
        ),
        click.option(
            "--cpu",
            type=float,
            help="CPU cores per instance: its quota on a worker that runs as root [default: 1].",
        ),
        click.option(
            "--ram", type=int, help="Bytes of RAM per instance (for --js, its heap limit)."
        ),
        click.option("--disk", type=int, help="Bytes of disk per instance (kept)."),
        click.option("--custom-runtime-options", help="Kept (Pulsar's Kubernetes runtime option)."),
        click.option("--runtime-flags", help="Kept (Pulsar's process runtime option)."),
        click.option(
            "--window-length-count",
            "--windowLengthCount",
            type=int,
            help="A window function: process receives the list of each window's values; "
            "this many messages per window.",
        ),
        click.option(
            "--window-length-duration-ms",
            "--windowLengthDurationMs",
            type=int,
            help="A window function with windows of this many milliseconds.",
        ),
        click.option(
            "--sliding-interval-count",
            "--slidingIntervalCount",
            type=int,
            help="A window fires every this many messages [default: its length: tumbling].",
        ),
        click.option(
            "--sliding-interval-duration-ms",
            "--slidingIntervalDurationMs",
            type=int,
            help="A window fires every this many milliseconds [default: its length].",
        ),
        click.option(
            "--timestamp-extractor",
            "timestamp_extractor_class_name",
            help="Event-time windows: module.Class whose extract_timestamp(input) gives an "
            "input's time in ms; magnetar.instance.windowing.EventTime takes the messages' "
            "event time.",
        ),
        click.option(
            "--lag-ms",
            "max_lag_ms",
            type=int,
            help="Event time: how far behind the newest input an input may be [default: 0].",
        ),
        click.option(
            "--watermark-emit-interval-ms",
            type=int,
            help="Event time: how often windows catch up with it [default: 1000].",
        ),
        click.option("--late-data-topic", help="Event time: where inputs too late go."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def is_url(value: str) -> bool:
    """Whether a --py value names a package URL rather than a local file."""
    return value.startswith(_URL_SCHEMES)


_JSON_FLAGS = {
    "user_config": "--user-config",
    "secrets": "--secrets",
    "custom_serde_inputs": "--custom-serde-inputs",
    "custom_schema_inputs": "--custom-schema-inputs",
    "custom_schema_outputs": "--custom-schema-outputs",
    "input_specs": "--input-specs",
    "producer_config": "--producer-config",
    "url_bindings": "--url-bindings",
}
_BOOL_FLAGS = {
    "auto_ack": "--auto-ack",
    "skip_to_latest": "--skip-to-latest",
    "forward_source_message_property": "--forward-source-message-property",
    "cleanup_subscription": "--cleanup-subscription",
}
_WINDOW_FLAGS = {
    "window_length_count": "windowLengthCount",
    "window_length_duration_ms": "windowLengthDurationMs",
    "sliding_interval_count": "slidingIntervalCount",
    "sliding_interval_duration_ms": "slidingIntervalDurationMs",
    "timestamp_extractor_class_name": "timestampExtractorClassName",
    "max_lag_ms": "maxLagMs",
    "watermark_emit_interval_ms": "watermarkEmitIntervalMs",
    "late_data_topic": "lateDataTopic",
}


def config_fields(function_config_file: str | None, **flags: Any) -> dict[str, Any]:
    """FunctionConfig fields (camelCase) from the config file overlaid with the given flags."""
    from pydantic.alias_generators import to_camel

    from magnetar.instance.config import load_config_file

    data: dict[str, Any] = load_config_file(function_config_file) if function_config_file else {}
    inputs = flags.pop("inputs", None)
    if inputs:
        data["inputs"] = [t.strip() for t in inputs.split(",") if t.strip()]
    for field, flag in _JSON_FLAGS.items():
        value = _json_option(flags.pop(field, None), flag)
        if value is not None:
            data[to_camel(field)] = value
    for field, flag in _BOOL_FLAGS.items():
        value = _bool_option(flags.pop(field, None), flag)
        if value is not None:
            data[to_camel(field)] = value
    window = {
        key: value
        for field, key in _WINDOW_FLAGS.items()
        if (value := flags.pop(field, None)) is not None
    }
    if window:
        data["windowConfig"] = {**data.get("windowConfig", {}), **window}
    resources = {
        key: value for key in ("cpu", "ram", "disk") if (value := flags.pop(key, None)) is not None
    }
    if resources:
        data["resources"] = {**data.get("resources", {}), **resources}
    for field, value in flags.items():
        if value is not None and value is not False:
            data[to_camel(field)] = value
    if data.get("py") and not is_url(data["py"]):
        data["py"] = str(Path(data["py"]).expanduser().resolve())
    if data.get("js") and not is_url(data["js"]):
        data["js"] = str(Path(data["js"]).expanduser().resolve())
    return data


def config_from_flags(function_config_file: str | None, **flags: Any) -> FunctionConfig:
    """The validated FunctionConfig from the config file overlaid with the given flags."""
    from magnetar.instance.config import FunctionConfig

    return FunctionConfig.parse(config_fields(function_config_file, **flags))


def with_default_name(config: FunctionConfig) -> FunctionConfig:
    """The config, named after its class or file when it has no name (as pulsar-admin does)."""
    if config.name:
        return config
    if config.js:  # a script's functions are named process: the file names it better
        name = Path(config.js).stem
    elif config.class_name:
        name = config.class_name.rsplit(".", 1)[-1]
    elif config.py:
        name = Path(config.py).stem
    else:
        raise click.UsageError("pass --name, --classname, --py or --js")
    return config.model_copy(update={"name": name})


def _json_option(value: str | None, flag: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"{flag} must be JSON: {error}") from None


def _bool_option(value: str | None, flag: str) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise click.BadParameter(f"{flag} takes true or false, not {value!r}")
    return lowered == "true"
