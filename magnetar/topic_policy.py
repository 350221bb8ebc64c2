"""Which topics a function may name: the one home of the rule, for the REST API (at
register and update) and the instance (at run time, ``context.publish``).

Two walls:

* **The system namespace** (the worker's ``system_namespace``: metadata, assignments,
  packages, state journals) is the cluster's own. No function, whoever registers it, may
  consume from or produce to a topic of it.
* **Tenants** (with authentication on): a function of tenant T may name only T's topics,
  unless a superuser registers it. A short name (``my-topic``) is ``public/default``'s, as
  everywhere in Pulsar, so a function of another tenant names its topics in full.

Pure: no worker or instance imports, so every layer can consult it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["NamedTopic", "TopicRefusal", "check_topic", "check_topics", "named_topics"]

DEFAULT_NAMESPACE = "public/default"
"""Where a short topic name lives."""

Operation = Literal["CONSUME", "PRODUCE"]
"""Pulsar's TopicOperation names, as its authorization refusals say them."""


@dataclass(frozen=True)
class TopicRefusal:
    """Why a function may not name a topic.

    ``system`` tells the two walls apart: True for the system namespace (no role may; a
    config error, HTTP 400), False for another tenant's topic (the role may not; HTTP 401,
    as Pulsar refuses a topic operation)."""

    reason: str
    system: bool

    def __str__(self) -> str:
        return self.reason


def check_topic(
    topic: str,
    tenant: str,
    system_namespace: str,
    superuser: bool,
    operation: Operation = "PRODUCE",
    field: str = "topic",
    pattern: bool = False,
) -> TopicRefusal | None:
    """Whether a function of ``tenant`` may ``operation`` on ``topic`` (a topics pattern
    when ``pattern``); None when it may. ``superuser``: whether the function was registered
    by a superuser, or authentication is off (then only the system namespace is walled);
    ``field`` names the topic's place in the config for the reason."""
    parsed = _namespace_of(topic)
    if parsed is None:
        return None  # no client takes it for a topic: FunctionConfig says what is wrong
    full, topic_tenant, namespace = parsed
    if _in_namespace(topic_tenant, namespace, system_namespace, pattern):
        return TopicRefusal(
            f"{field} names {full}, a topic of the system namespace {system_namespace}: "
            "no function may consume from or produce to the functions worker's own topics",
            system=True,
        )
    if not superuser and topic_tenant != tenant:
        # Pulsar's broker refusing a topic operation (PulsarWebResource)
        return TopicRefusal(
            f"Unauthorized to validateTopicOperation for operation [{operation}] on topic [{full}]",
            system=False,
        )
    return None


def _namespace_of(topic: str) -> tuple[str, str, str] | None:
    """The full name, tenant and namespace of a topic or topics pattern, as Pulsar's clients
    read them (a pattern's regex may hold '/' after the namespace); None for 'a/b'."""
    if "://" in topic:
        full = topic
    elif "/" not in topic:
        full = f"persistent://{DEFAULT_NAMESPACE}/{topic}"
    else:
        full = f"persistent://{topic}"
    parts = full.partition("://")[2].split("/", 2)
    if len(parts) < 3:
        return None
    return full, parts[0], parts[1]


def _in_namespace(tenant: str, namespace: str, system_namespace: str, pattern: bool) -> bool:
    """Whether ``tenant/namespace`` is the system namespace; a pattern's parts also when
    read as regular expressions (Pulsar's clients read them literally, but a broker that
    matched them would reach it)."""
    system_tenant, _, system_local = system_namespace.partition("/")
    if (tenant, namespace) == (system_tenant, system_local):
        return True
    return pattern and _matches(tenant, system_tenant) and _matches(namespace, system_local)


def _matches(part: str, name: str) -> bool:
    try:
        return re.fullmatch(part, name) is not None
    except re.error:
        return False


def check_topics(
    config: Mapping[str, Any], tenant: str, system_namespace: str, superuser: bool
) -> TopicRefusal | None:
    """The first topic of ``config`` (a FunctionConfig as JSON, Pulsar's field names) that a
    function of ``tenant`` may not name, as :func:`check_topic` decides; None when all may
    be named."""
    for named in named_topics(config):
        refusal = check_topic(
            named.topic,
            tenant,
            system_namespace,
            superuser,
            named.operation,
            named.field,
            named.pattern,
        )
        if refusal is not None:
            return refusal
    return None


@dataclass(frozen=True)
class NamedTopic:
    """A topic (or topics pattern) a FunctionConfig names, and where."""

    field: str
    topic: str
    operation: Operation
    pattern: bool = False


def named_topics(config: Mapping[str, Any]) -> Iterator[NamedTopic]:
    """Every topic and topics pattern a FunctionConfig (as JSON) names."""
    for topic in _strings(_field(config, "inputs")):
        yield NamedTopic("inputs", topic, "CONSUME")
    pattern = _field(config, "topicsPattern")
    if isinstance(pattern, str) and pattern:
        yield NamedTopic("topicsPattern", pattern, "CONSUME", pattern=True)
    for name in ("inputSpecs", "customSerdeInputs", "customSchemaInputs"):
        specs = _field(config, name)
        if isinstance(specs, Mapping):
            for topic, spec in specs.items():
                regex = isinstance(spec, Mapping) and any(
                    spec.get(flag) is True for flag in ("isRegexPattern", "isRegex", "is_regex")
                )
                yield NamedTopic(f"{name}[{topic}]", str(topic), "CONSUME", pattern=regex)
    for name in ("output", "logTopic", "deadLetterTopic"):
        topic = _field(config, name)
        if isinstance(topic, str) and topic:
            yield NamedTopic(name, topic, "PRODUCE")
    window = _field(config, "windowConfig")
    if isinstance(window, Mapping):
        late = _field(window, "lateDataTopic")
        if isinstance(late, str) and late:
            yield NamedTopic("windowConfig.lateDataTopic", late, "PRODUCE")


def _field(config: Mapping[str, Any], camel: str) -> Any:
    """A field by its Pulsar (camelCase) name, or the snake_case one FunctionConfig also
    accepts."""
    if camel in config:
        return config[camel]
    return config.get(re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), camel))


def _strings(values: Any) -> Iterable[str]:
    if isinstance(values, str):
        return [values]
    if isinstance(values, Iterable):
        return [value for value in values if isinstance(value, str)]
    return []
