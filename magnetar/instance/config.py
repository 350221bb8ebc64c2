"""FunctionConfig: a function's configuration, in Apache Pulsar's JSON field names.

A config file or REST body written for Apache Pulsar Functions parses unchanged; fields
Pulsar has but Magnetar does not use (resources, runtimeFlags, ...) are accepted and
ignored, unknown fields are rejected so a typo does not pass silently.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from magnetar.instance.exceptions import InvalidFunctionConfigError
from magnetar.instance.url_bindings import UrlBinding, check_url_bindings
from magnetar.instance.windowing.config import WindowConfig
from magnetar.topics import base_topic, full_topic_name

__all__ = [
    "LONGEST_TIME_LIMIT_S",
    "SCHEMA_TYPES",
    "ConsumerSpec",
    "FunctionConfig",
    "ProcessingGuarantees",
    "ProducerSpec",
    "Runtime",
    "SubscriptionPosition",
    "SubscriptionType",
    "WindowConfig",
]


class ProcessingGuarantees(StrEnum):
    ATLEAST_ONCE = "ATLEAST_ONCE"
    ATMOST_ONCE = "ATMOST_ONCE"
    EFFECTIVELY_ONCE = "EFFECTIVELY_ONCE"
    MANUAL = "MANUAL"


class SubscriptionPosition(StrEnum):
    LATEST = "Latest"
    EARLIEST = "Earliest"


class Runtime(StrEnum):
    """The language a function is written in (Pulsar's ``runtime`` field)."""

    PYTHON = "PYTHON"
    JAVASCRIPT = "JAVASCRIPT"


LONGEST_TIME_LIMIT_S = 1e9
"""The longest ``timeoutMs`` enforced as given (about 31 years); a longer one is enforced as
this. The timers behind it (``setitimer``, a thread's timed wait) overflow not far above, and
no invocation runs that long."""

JAVASCRIPT_SERDES = ("string", "json")
"""SerDe names of JavaScript functions: ``string`` (UTF-8 text, the default) or ``json``."""


class SubscriptionType(StrEnum):
    SHARED = "Shared"
    FAILOVER = "Failover"
    KEY_SHARED = "Key_Shared"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        extra="forbid",
        use_enum_values=False,
    )


class ConsumerSpec(_Model):
    """Per-input settings (Pulsar's ``inputSpecs`` entry)."""

    serde_class_name: str | None = None
    """SerDe class for this input, ``module.ClassName``."""
    is_regex: bool = Field(
        default=False,
        # regexPattern: as Pulsar's worker answers it (functions get), sent back
        validation_alias=AliasChoices("isRegexPattern", "regexPattern", "isRegex", "is_regex"),
        serialization_alias="isRegexPattern",
    )
    """The key is a topic pattern rather than a topic (Pulsar's ``isRegexPattern``)."""
    receiver_queue_size: int | None = Field(default=None, ge=1)
    """Prefetch depth of this input's consumer."""
    schema_type: str | None = None
    """STRING, BYTES, JSON or AVRO: the input is decoded by this schema, JSON and AVRO into
    the record class (``inputTypeClassName``, or the annotation of ``process``'s input)."""
    # Accepted and ignored, so a config exported from Pulsar parses.
    schema_properties: dict[str, Any] | None = None
    consumer_properties: dict[str, Any] | None = None
    crypto_config: dict[str, Any] | None = None
    pool_messages: bool | None = None
    message_payload_processor_config: dict[str, Any] | None = None


class ProducerSpec(_Model):
    """The output producer's settings (Pulsar's ``producerConfig``)."""

    max_pending_messages: int | None = Field(default=None, ge=1)
    """Sends in flight before a send waits."""
    compression_type: str | None = None
    """NONE, LZ4, ZLIB, ZSTD or SNAPPY."""
    batch_builder: str | None = None
    """DEFAULT or KEY_BASED."""
    batching_config: dict[str, Any] | None = None
    """PIP-401's batching settings (``enabled``, ``batchingMaxPublishDelayMs``,
    ``batchingMaxMessages``, ``batchingMaxBytes``); when set, batches wait for their delay."""
    # Accepted and kept: Pulsar's Java producer options without a meaning here.
    max_pending_messages_across_partitions: int | None = None
    use_thread_local_producers: bool | None = None
    crypto_config: dict[str, Any] | None = None


class FunctionConfig(_Model):
    """A function's configuration. Field names are Apache Pulsar's FunctionConfig (camelCase in
    JSON, snake_case in Python)."""

    tenant: str = "public"
    """Tenant of the function; part of its FQFN."""
    namespace: str = "default"
    """Namespace of the function; part of its FQFN."""
    name: str | None = None
    """Name of the function; defaults to the class or function name of the code."""
    class_name: str | None = None
    """``module.ClassName``, ``module.function`` or a name inside the ``py`` module; for a
    JavaScript function, the script's function to call (default ``process``)."""
    runtime: Runtime = Runtime.PYTHON
    """Language of the code: PYTHON, or JAVASCRIPT (the default when only ``js`` is set)."""
    py: str | None = None
    """Path of a ``.py`` file or a ``.zip`` holding the function's module."""
    js: str | None = None
    """Path of the ``.js`` script of a JAVASCRIPT function."""
    inputs: list[str] = Field(default_factory=list)
    """Input topics, read with the default SerDe."""
    topics_pattern: str | None = None
    """A regular expression of input topics (``persistent://tenant/ns/prefix-.*``)."""
    custom_serde_inputs: dict[str, str] = Field(default_factory=dict)
    """Input topic -> SerDe class name."""
    input_specs: dict[str, ConsumerSpec] = Field(default_factory=dict)
    """Input topic (or pattern) -> per-input settings."""
    output: str | None = None
    """Topic the function's return values go to; none means results are dropped."""
    output_serde_class_name: str | None = None
    """SerDe class for the output; Pulsar's IdentitySerDe when unset."""
    output_schema_type: str | None = None
    """STRING, BYTES, JSON or AVRO: the output is encoded by this schema, which is registered
    on the output topic (JSON and AVRO from the record class ``outputTypeClassName``, or the
    annotation of what ``process`` returns)."""
    custom_schema_inputs: dict[str, str] = Field(default_factory=dict)
    """Input topic -> schema type, as ``inputSpecs[topic].schemaType``."""
    input_type_class_name: str | None = None
    """The ``pulsar.schema.Record`` class a JSON or AVRO input is decoded into."""
    output_type_class_name: str | None = None
    """The ``pulsar.schema.Record`` class of a JSON or AVRO output."""
    log_topic: str | None = None
    """Topic the function's log records are published to."""
    processing_guarantees: ProcessingGuarantees = ProcessingGuarantees.ATLEAST_ONCE
    """When an input is acknowledged relative to its processing."""
    user_config: dict[str, Any] = Field(default_factory=dict)
    """Free-form settings the function reads through ``context.get_user_config_value``."""
    secrets: dict[str, Any] = Field(default_factory=dict)
    """Secret name -> provider-specific locator; values come from the secrets provider."""
    parallelism: int = Field(default=1, ge=1)
    """Number of instances."""
    auto_ack: bool = True
    """Acknowledge inputs automatically; false leaves acking to the function (MANUAL)."""
    max_message_retries: int | None = None
    """Redeliveries of a failing message before it goes to the dead-letter topic."""
    dead_letter_topic: str | None = None
    """Where messages go once ``maxMessageRetries`` is exhausted."""
    sub_name: str | None = None
    """Subscription name; defaults to the FQFN."""
    subscription_position: SubscriptionPosition = SubscriptionPosition.LATEST
    """Where a new subscription starts."""
    retain_ordering: bool = False
    """Process messages in order (Failover subscription)."""
    retain_key_ordering: bool = False
    """Process messages of one key in order (Key_Shared subscription)."""
    timeout_ms: int | None = Field(default=None, gt=0)
    """Upper bound of one invocation of the function (enforced up to ``LONGEST_TIME_LIMIT_S``)."""
    forward_source_message_property: bool = True
    """Copy the input message's properties onto the output message."""
    cleanup_subscription: bool | None = None
    """Whether deleting the function deletes its subscription (Pulsar's default: yes)."""
    producer_config: ProducerSpec | None = None
    """Settings of the output producer (Pulsar's ``producerConfig``)."""
    batch_builder: str | None = None
    """How outputs are batched: DEFAULT, or KEY_BASED (one batch per key)."""
    max_pending_async_requests: int | None = Field(default=None, ge=1)
    """Most invocations of an ``async def process`` in flight at once (default 1000)."""
    skip_to_latest: bool | None = None
    url_bindings: list[UrlBinding] = Field(default_factory=list)
    """The HTTP endpoints a JavaScript function may call with ``curl()`` (Magnetar's, after
    Couchbase Eventing's URL bindings; see ``magnetar.instance.url_bindings``)."""
    """On every start of an instance, skip what arrived while it was not running."""
    jar: str | None = None
    """A Java function's jar: refused (Magnetar runs Python and JavaScript)."""
    go: str | None = None
    """A Go function's binary: refused (Magnetar runs Python and JavaScript)."""
    function_type: str | None = None
    """A built-in Java function type: refused, as ``jar``."""
    # Accepted and kept, without effect: Pulsar uses them for Java functions or for its
    # Kubernetes and process runtimes only (its Python runtime ignores them too).
    resources: dict[str, Any] | None = None
    runtime_flags: str | None = None
    expose_pulsar_admin_client_enabled: bool | None = None
    custom_runtime_options: str | None = None
    custom_schema_outputs: dict[str, str] | None = None
    window_config: WindowConfig | None = None
    """Makes the function a window function: ``process`` receives the list of a window's
    values, once per window (see ``magnetar.instance.windowing``)."""

    @model_validator(mode="before")
    @classmethod
    def _infer_runtime(cls, data: Any) -> Any:
        # As pulsar-admin infers the runtime from --py/--jar/--go, a script implies JAVASCRIPT.
        if isinstance(data, dict) and data.get("js") and data.get("runtime") is None:
            return {**data, "runtime": Runtime.JAVASCRIPT}
        return data

    @model_validator(mode="before")
    @classmethod
    def _windows_acknowledge_themselves(cls, data: Any) -> Any:
        # As Pulsar (FunctionConfigUtils.inferMissingArguments): the windows acknowledge
        # their inputs, so a window function's autoAck is false, whatever it was.
        if (
            not isinstance(data, dict)
            or data.get("windowConfig", data.get("window_config")) is None
        ):
            return data
        fields = {k: v for k, v in data.items() if k not in ("autoAck", "auto_ack")}
        return {**fields, "autoAck": False}

    @field_validator("runtime", mode="before")
    @classmethod
    def _known_runtime(cls, value: Any) -> Any:
        supported = ", ".join(Runtime)
        if not isinstance(value, str) or value.upper() not in supported.split(", "):
            raise ValueError(f"runtime {value!r} is not supported (supported: {supported})")
        return value.upper()

    @model_validator(mode="after")
    def _check(self) -> FunctionConfig:
        _validate(self)
        return self

    # --- derived views -------------------------------------------------------------------

    @property
    def fqfn(self) -> str:
        """``tenant/namespace/name``."""
        return f"{self.tenant}/{self.namespace}/{self.name}"

    @property
    def is_javascript(self) -> bool:
        """Whether the function is a JavaScript script run on V8."""
        return self.runtime is Runtime.JAVASCRIPT

    @property
    def code_path(self) -> str | None:
        """The function's code file: ``js`` for JAVASCRIPT, else ``py``."""
        return self.js if self.is_javascript else self.py

    @property
    def subscription_name(self) -> str:
        return self.sub_name or self.fqfn

    @property
    def acks_automatically(self) -> bool:
        """Whether the instance acknowledges every input itself (on receipt, or once
        processed), not the function (``MANUAL``, ``autoAck`` false)."""
        return self.auto_ack and self.processing_guarantees is not ProcessingGuarantees.MANUAL

    @property
    def subscription_type(self) -> SubscriptionType:
        if self.retain_key_ordering:
            return SubscriptionType.KEY_SHARED
        if self.retain_ordering or (
            self.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
        ):
            return SubscriptionType.FAILOVER
        return SubscriptionType.SHARED

    def input_serdes(self) -> dict[str, str | None]:
        """Every input topic (full name) -> its SerDe class name (None: the default)."""
        topics: dict[str, str | None] = {full_topic_name(t): None for t in self.inputs}
        for topic, serde in self.custom_serde_inputs.items():
            topics[full_topic_name(topic)] = serde
        for topic, spec in self.input_specs.items():
            if not spec.is_regex:
                full = full_topic_name(topic)
                topics[full] = spec.serde_class_name or topics.get(full)
        return topics

    def input_schemas(self) -> dict[str, str]:
        """Input topic (full name) -> the schema type it is decoded with, where one is set."""
        schemas = {full_topic_name(t): kind for t, kind in self.custom_schema_inputs.items()}
        for topic, spec in self.input_specs.items():
            if spec.schema_type and not spec.is_regex:
                schemas[full_topic_name(topic)] = spec.schema_type
        return schemas

    def input_patterns(self) -> list[str]:
        patterns = [self.topics_pattern] if self.topics_pattern else []
        patterns += [t for t, spec in self.input_specs.items() if spec.is_regex]
        return patterns

    def to_json(self) -> str:
        """The config as Pulsar-style JSON (camelCase, unset fields left out)."""
        return self.model_dump_json(by_alias=True, exclude_none=True)

    # --- constructors --------------------------------------------------------------------

    @classmethod
    def parse(cls, data: dict[str, Any]) -> FunctionConfig:
        """Validate a dict of Pulsar field names; errors become InvalidFunctionConfigError."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise InvalidFunctionConfigError(_describe(error)) from None

    @classmethod
    def from_file(cls, path: str | Path) -> FunctionConfig:
        """Load a JSON or YAML function config file (``--function-config-file``)."""
        return cls.parse(load_config_file(path))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping in a JSON or YAML config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise InvalidFunctionConfigError(
            f"cannot read function config file {path}: {error.strerror}"
        ) from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as error:
        raise InvalidFunctionConfigError(
            f"function config file {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {error}"
        ) from None
    if not isinstance(data, dict):
        raise InvalidFunctionConfigError(f"function config file {path} must hold a mapping")
    return data


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "config"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{field}: {message}" if item["loc"] else message)
    return "invalid function config: " + "; ".join(problems)


def _validate(config: FunctionConfig) -> None:
    """Pulsar's FunctionConfig rules, with messages that say how to fix the config."""
    guarantees = config.processing_guarantees
    for field in ("tenant", "namespace", "name"):
        value = getattr(config, field)
        if value is not None and (not value or "/" in value):
            raise ValueError(f"{field} {value!r} must be non-empty and contain no '/'")
    try:
        inputs = config.input_serdes()
        output = base_topic(config.output) if config.output else None
        for topic in (config.log_topic, config.dead_letter_topic):
            if topic:
                full_topic_name(topic)
    except ValueError as error:
        raise ValueError(str(error)) from None
    patterns = config.input_patterns()
    if not inputs and not patterns:
        raise ValueError(
            "no input topic: set inputs (--inputs), topicsPattern (--topics-pattern) "
            "or customSerdeInputs"
        )
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"topicsPattern {pattern!r} is not a valid regex: {error}") from None
    if output is not None and output in {base_topic(t) for t in inputs}:
        raise ValueError(
            f"output topic {config.output!r} is also an input topic; a function may not "
            "consume its own output"
        )
    if config.max_message_retries is not None and config.max_message_retries < 1:
        raise ValueError(
            f"maxMessageRetries must be at least 1, not {config.max_message_retries}: Pulsar "
            "counts redeliveries from 1; leave it unset to retry without limit"
        )
    if config.dead_letter_topic and config.max_message_retries is None:
        raise ValueError(
            "deadLetterTopic is set but maxMessageRetries is not: set maxMessageRetries "
            "(--max-message-retries) so messages reach the dead-letter topic"
        )
    if config.dead_letter_topic and output and base_topic(config.dead_letter_topic) == output:
        raise ValueError("deadLetterTopic must differ from the output topic")
    if (
        guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
        and config.max_message_retries is not None
    ):
        raise ValueError(
            "maxMessageRetries cannot be used with EFFECTIVELY_ONCE: a retried message "
            "would be processed out of order"
        )
    if guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE and config.retain_key_ordering:
        raise ValueError(
            "retainKeyOrdering cannot be used with EFFECTIVELY_ONCE, which already keeps "
            "all messages in order (Failover subscription)"
        )
    if config.retain_ordering and config.retain_key_ordering:
        raise ValueError("retainOrdering and retainKeyOrdering are mutually exclusive")
    at_most_once = guarantees is ProcessingGuarantees.ATMOST_ONCE
    if at_most_once and not config.auto_ack and config.window_config is None:
        raise ValueError(
            "autoAck=false cannot be used with ATMOST_ONCE, which acknowledges every "
            "message on receipt; use MANUAL to acknowledge from the function"
        )
    _validate_producer(config)
    _validate_schemas(config)
    _validate_code(config)


_COMPRESSION_TYPES = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
_BATCH_BUILDERS = ("DEFAULT", "KEY_BASED")


SCHEMA_TYPES = ("STRING", "BYTES", "JSON", "AVRO")
"""The schema types a function's inputs and output may have (those of pulsar-client)."""


def _validate_schemas(config: FunctionConfig) -> None:
    """Schemas are known types, and replace (rather than join) a SerDe."""
    serdes = {topic: serde for topic, serde in config.input_serdes().items() if serde}
    for topic, kind in config.input_schemas().items():
        _check_schema_type(kind, f"the schema type of input {topic}")
        if topic in serdes:
            raise ValueError(
                f"input {topic} has a SerDe ({serdes[topic]}) and a schema type ({kind}): "
                "a message is decoded by one of them, so set only one"
            )
    if config.output_schema_type:
        _check_schema_type(config.output_schema_type, "outputSchemaType")
        if config.output_serde_class_name:
            raise ValueError(
                "outputSerdeClassName and outputSchemaType are both set: the output is encoded "
                "by one of them, so set only one"
            )
    if config.is_javascript and (config.input_schemas() or config.output_schema_type):
        raise ValueError(
            "schemas are for Python functions; a JavaScript function reads and writes "
            "'string' or 'json' (customSerdeInputs, outputSerdeClassName)"
        )


def _check_schema_type(kind: str, what: str) -> None:
    if kind.upper() not in SCHEMA_TYPES:
        raise ValueError(f"{what} is {kind!r}; it must be one of {', '.join(SCHEMA_TYPES)}")


def _validate_producer(config: FunctionConfig) -> None:
    producer = config.producer_config
    builders = [config.batch_builder, producer.batch_builder if producer else None]
    for builder in builders:
        # blank: unset, as Pulsar's worker answers an unset one
        if builder and builder.upper() not in _BATCH_BUILDERS:
            raise ValueError(f"batchBuilder {builder!r} must be DEFAULT or KEY_BASED")
    compression = producer.compression_type if producer else None
    if compression is not None and compression.upper() not in _COMPRESSION_TYPES:
        raise ValueError(
            f"producerConfig.compressionType {compression!r} must be one of "
            f"{', '.join(_COMPRESSION_TYPES)}"
        )


def _validate_window(config: FunctionConfig) -> None:
    """A window function's rules beyond its windowConfig's own (Pulsar's messages)."""
    window = config.window_config
    if window is None:
        return
    guarantees = config.processing_guarantees
    if guarantees in (ProcessingGuarantees.EFFECTIVELY_ONCE, ProcessingGuarantees.MANUAL):
        raise ValueError(f"Windows Function not support {guarantees} delivery semantics.")
    if config.is_javascript:
        raise ValueError(
            "windowConfig is set, but window functions are Python functions: a JavaScript "
            "function processes each message (keep a window in its state)"
        )
    late = window.late_data_topic
    if late is not None:
        try:
            late_topic = base_topic(late)
        except ValueError as error:
            raise ValueError(f"windowConfig.lateDataTopic: {error}") from None
        if late_topic in {base_topic(topic) for topic in config.input_serdes()}:
            raise ValueError(
                f"windowConfig.lateDataTopic {late!r} is also an input topic; late inputs "
                "would come back as inputs"
            )


def _validate_code(config: FunctionConfig) -> None:
    """The code fields must match the runtime; JavaScript takes its own SerDe names."""
    for field, what in (("jar", "Java"), ("function_type", "built-in Java"), ("go", "Go")):
        if getattr(config, field):
            raise ValueError(
                f"{to_camel(field)} is set, but Magnetar runs Python (py) and JavaScript (js) "
                f"functions, not {what} ones; run those on Apache Pulsar's own functions worker"
            )
    _validate_window(config)
    if config.py and config.js:
        raise ValueError("set py (--py) or js (--js), not both: a function has one code file")
    if config.is_javascript:
        if config.py:
            raise ValueError(
                "py is set but runtime is JAVASCRIPT: a JavaScript function's script goes in "
                "js (--js); for a Python function set runtime PYTHON"
            )
        serdes = {
            **{f"customSerdeInputs[{t}]": s for t, s in config.custom_serde_inputs.items()},
            **{
                f"inputSpecs[{t}].serdeClassName": s.serde_class_name
                for t, s in config.input_specs.items()
            },
            "outputSerdeClassName": config.output_serde_class_name,
        }
        for field, serde in serdes.items():
            if serde is not None and serde not in JAVASCRIPT_SERDES:
                raise ValueError(
                    f"{field} is {serde!r}, but a JavaScript function reads and writes "
                    f"'string' (the default) or 'json'"
                )
        check_url_bindings(config.url_bindings, config.secrets)
        ram = (config.resources or {}).get("ram")
        if ram is not None and (isinstance(ram, bool) or not isinstance(ram, int) or ram <= 0):
            raise ValueError(f"resources.ram must be a positive number of bytes, not {ram!r}")
    elif config.js:
        raise ValueError(
            "js is set but runtime is PYTHON: a JavaScript function needs runtime JAVASCRIPT "
            "(or no runtime at all); a Python function's code goes in py (--py)"
        )
    elif config.url_bindings:
        raise ValueError(
            "urlBindings are for JavaScript functions (curl()); a Python function makes its "
            "HTTP requests itself"
        )
