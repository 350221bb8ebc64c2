"""From a FunctionConfig with ``js`` to a running script: checking its file, and building the
executor of an instance (its settings, its SerDes, its limits)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript._check import check_script
from magnetar.instance.javascript._curl import UrlClient
from magnetar.instance.javascript._engine import (
    DEFAULT_MEMORY_LIMIT_BYTES,
    DEFAULT_TIMEOUT_MS,
    ScriptEngine,
    read_script,
)
from magnetar.instance.javascript._executor import ScriptExecutor
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.secrets import SecretsProvider
from magnetar.instance.state import StateStore, UnconfiguredStateStore
from magnetar.instance.url_hosts import PUBLIC_HOSTS, UrlHostRule
from magnetar.topics import full_topic_name

__all__ = ["check_script_file", "open_executor", "script_limits"]


def script_limits(config: FunctionConfig) -> tuple[int, int]:
    """The per-message time limit (ms) and the heap limit (bytes) of the function."""
    ram = (config.resources or {}).get("ram")
    return config.timeout_ms or DEFAULT_TIMEOUT_MS, int(ram or DEFAULT_MEMORY_LIMIT_BYTES)


def check_script_file(config: FunctionConfig) -> None:
    """``check_script`` for the config's ``js`` file."""
    if not config.js:
        raise FunctionLoadError("no function script: pass --js FILE")
    timeout_ms, memory = script_limits(config)
    check_script(
        read_script(config.js), Path(config.js).name, config.class_name, timeout_ms, memory
    )


def open_executor(
    config: FunctionConfig,
    instance_id: int,
    state: StateStore,
    metrics: InstanceMetrics,
    logger: logging.Logger,
    secrets_provider: SecretsProvider,
    stop_on_error: bool,
    url_hosts: UrlHostRule = PUBLIC_HOSTS,
) -> ScriptExecutor:
    """The executor of one instance: its script loaded in a V8 context of its own;
    ``url_hosts``: where its URL bindings may connect (the worker's rule)."""
    if not config.js:
        raise FunctionLoadError(f"function {config.fqfn} has no code: set js (--js)")
    timeout_ms, memory = script_limits(config)
    urls = (
        UrlClient(config.url_bindings, config.secrets, secrets_provider, url_hosts)
        if config.url_bindings
        else None
    )
    settings = {
        "name": config.name,
        "tenant": config.tenant,
        "namespace": config.namespace,
        "instanceId": instance_id,
        "inputTopics": sorted(config.input_serdes()) + config.input_patterns(),
        "outputTopic": config.output,
        "userConfig": config.user_config,
        "secrets": {
            name: secrets_provider.provide_secret(name, locator)
            for name, locator in config.secrets.items()
        },
        "stateEnabled": not isinstance(state, UnconfiguredStateStore),
        "stateError": (
            f"state is not configured for function {config.fqfn}: this instance runs without "
            "a state store, so incrCounter/getCounter/delCounter/putState/getState are "
            "unavailable"
        ),
        "outputJson": config.output_serde_class_name == "json",
        "stopOnError": stop_on_error,
        "urlBindings": urls.aliases if urls else [],
    }
    source = read_script(config.js)
    engine = ScriptEngine(
        source, Path(config.js).name, config.class_name, settings, timeout_ms, memory
    )
    return ScriptExecutor(
        engine,
        {topic: serde == "json" for topic, serde in config.input_serdes().items()},
        [re.compile(_pattern(p)) for p, s in _pattern_serdes(config) if s == "json"],
        state,
        metrics,
        logger,
        timeout_ms,
        stop_on_error,
        # metadata costs a few microseconds a message: sent up front only to scripts that
        # name a getter (others get it when they first ask, see the prelude)
        with_metadata=any(getter in source for getter in _METADATA_GETTERS),
        urls=urls,
    )


_METADATA_GETTERS = ("getMessage", "getCurrentMessageTopicName")


def _pattern_serdes(config: FunctionConfig) -> list[tuple[str, str | None]]:
    return [(p, spec.serde_class_name) for p, spec in config.input_specs.items() if spec.is_regex]


def _pattern(pattern: str) -> str:
    return full_topic_name(pattern) if "://" not in pattern else pattern
