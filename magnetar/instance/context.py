"""The Context a Python function sees: every method of ``pulsar.functions.context.Context``.

One Context per instance; the instance points it at the current message before each call
(as Apache Pulsar's Python instance does), so nothing is allocated per message.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pulsar.functions.context import Context as _SdkContext

from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import InstanceError
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.secrets import SecretsProvider
from magnetar.instance.serde import SerDe, load_serde
from magnetar.instance.state import StateStore
from magnetar.instance.timers import Timers, TimersUnavailable
from magnetar.instance.windowing.window import Window
from magnetar.topics import base_topic

__all__ = ["InstanceContext", "MessagePublisher"]

_MESSAGE_CONF_KEYS = frozenset(
    {
        "properties",
        "partition_key",
        "ordering_key",
        "sequence_id",
        "replication_clusters",
        "disable_replication",
        "event_timestamp",
        "deliver_at",
        "deliver_after",
    }
)


def _no_callbacks(callback: Any) -> str:
    raise InstanceError(
        "timers are available to functions whose process is a plain (not async) function or "
        "method, not to async or window functions"
    )


class MessagePublisher(Protocol):
    """What the Context needs from its instance to publish and acknowledge."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        message_conf: dict[str, Any],
        callback: Callable[[Any, Any], None] | None,
    ) -> None: ...

    def ack(self, message_id: Any, topic: str) -> None: ...


class InstanceContext(_SdkContext):  # type: ignore[misc]
    """The context of one function instance."""

    def __init__(
        self,
        config: FunctionConfig,
        instance_id: int,
        publisher: MessagePublisher,
        metrics: InstanceMetrics,
        state: StateStore,
        secrets_provider: SecretsProvider,
        logger: logging.Logger,
        search_paths: list[Path],
        function_version: str = "",
        publish_check: Callable[[str], None] | None = None,
    ) -> None:
        """``publish_check`` raises for a topic ``publish`` may not reach."""
        self._config = config
        self._publish_check = publish_check
        self._instance_id = instance_id
        self._publisher = publisher
        self._metrics = metrics
        self._state = state
        self._secrets_provider = secrets_provider
        self._logger = logger
        self._search_paths = search_paths
        self._function_version = function_version
        self._serdes: dict[str, SerDe] = {}
        self._input_topics = sorted(config.input_serdes()) + config.input_patterns()
        self.message: Any = None
        self.topic: str = ""
        self.window: Window | None = None
        self.timers: Timers | TimersUnavailable = TimersUnavailable(
            f"function {config.fqfn} cannot use timers: timers are kept in the function's "
            "state, and this instance runs without a state store"
        )
        """Set by the instance when its function can use timers."""
        self.timer_callback_name: Callable[[Any], str] = _no_callbacks

    def set_message(self, message: Any, topic: str) -> None:
        """Point the context at the message about to be processed."""
        self.message = message
        self.topic = topic

    def for_invocation(
        self, message: Any, topic: str, publisher: MessagePublisher, state: StateStore
    ) -> InstanceContext:
        """A context of its own for one invocation that runs beside others (an async
        function's), publishing and keeping state through the given ones."""
        context = copy.copy(self)
        context.message, context.topic = message, topic
        context._publisher, context._state = publisher, state
        return context

    # --- the current message ------------------------------------------------------------

    def get_message_id(self) -> Any:
        return self.message.message_id()

    def get_message_key(self) -> str:
        """The message's key; ``''`` when it has none, as in Apache Pulsar's runtime."""
        return str(self.message.partition_key())

    def get_message_eventtime(self) -> int:
        return int(self.message.event_timestamp())

    def get_message_properties(self) -> dict[str, str]:
        return dict(self.message.properties())

    def get_current_message_topic_name(self) -> str:
        return self.topic

    def get_partition_key(self) -> str:
        return str(self.message.partition_key())

    def get_ordering_key(self) -> bytes | None:
        return self.message.ordering_key() or None

    def get_window(self) -> Window:
        """The window being processed, with every input's record (a window function's:
        one with a ``windowConfig``). The current message is the window's newest input."""
        if self.window is None:
            raise InstanceError(
                f"function {self._config.fqfn} is not a window function: get_window() needs "
                "a windowConfig (--window-length-count or --window-length-duration-ms)"
            )
        return self.window

    # --- the function -------------------------------------------------------------------

    def get_function_tenant(self) -> str:
        return self._config.tenant

    def get_function_namespace(self) -> str:
        return self._config.namespace

    def get_function_name(self) -> str | None:
        return self._config.name

    def get_function_id(self) -> str:
        return self._config.fqfn

    def get_instance_id(self) -> int:
        return self._instance_id

    def get_function_version(self) -> str:
        return self._function_version

    def get_logger(self) -> logging.Logger:
        return self._logger

    def get_user_config_value(self, key: str) -> Any:
        return self._config.user_config.get(key)

    def get_user_config_map(self) -> dict[str, Any]:
        return dict(self._config.user_config)

    def get_secret(self, secret_name: str) -> Any:
        if secret_name not in self._config.secrets:
            return None
        return self._secrets_provider.provide_secret(secret_name, self._config.secrets[secret_name])

    def record_metric(self, metric_name: str, metric_value: float) -> None:
        if isinstance(metric_value, bool) or not isinstance(metric_value, int | float):
            raise TypeError(
                f"record_metric({metric_name!r}, ...) needs a number, got "
                f"{type(metric_value).__name__}"
            )
        self._metrics.record_user_metric(metric_name, float(metric_value))

    def get_input_topics(self) -> list[str]:
        return list(self._input_topics)

    def get_output_topic(self) -> str | None:
        return self._config.output

    def get_output_serde_class_name(self) -> str | None:
        return self._config.output_serde_class_name

    # --- publish and ack ----------------------------------------------------------------

    def publish(
        self,
        topic_name: str,
        message: Any,
        serde_class_name: str = "serde.IdentitySerDe",
        properties: dict[str, str] | None = None,
        compression_type: Any = None,
        callback: Callable[[Any, Any], None] | None = None,
        message_conf: dict[str, Any] | None = None,
    ) -> None:
        """Publish ``message`` to ``topic_name``, serialized with ``serde_class_name``.

        The send is asynchronous; under ATLEAST_ONCE and EFFECTIVELY_ONCE the input is
        acknowledged only once this publish has been persisted.
        """
        if self._publish_check is not None:
            self._publish_check(topic_name)
        serde = self._serdes.get(serde_class_name)
        if serde is None:
            serde = self._serdes[serde_class_name] = load_serde(
                serde_class_name, self._search_paths
            )
        conf = dict(message_conf or {})
        unknown = set(conf) - _MESSAGE_CONF_KEYS
        if unknown:
            raise ValueError(f"unknown message_conf keys: {', '.join(sorted(unknown))}")
        if properties:
            conf["properties"] = {**conf.get("properties", {}), **properties}
        self._publisher.publish(topic_name, serde.serialize(message), conf, callback)

    def ack(self, msgid: Any, topic: str) -> None:
        """Acknowledge a message (MANUAL processing guarantees, or autoAck=false)."""
        self._publisher.ack(msgid, base_topic(topic))

    # --- timers -------------------------------------------------------------------------

    def create_timer(
        self, callback: Callable[..., Any], when: Any, reference: str, payload: Any = None
    ) -> None:
        """Arm a timer: at ``when`` (epoch seconds or a datetime) or later, ``callback`` (a
        method of the function's class or a function of its module) is called as
        ``callback(payload, context)`` and what it returns is published like a result of
        ``process``. Arming ``reference`` again replaces its pending timer. The timer is
        durable once the input being processed is acknowledged."""
        self.timers.arm(self.timer_callback_name(callback), when, reference, payload)

    def cancel_timer(self, reference: str) -> bool:
        """Cancel the pending timer ``reference``; whether there was one."""
        return self.timers.cancel(reference)

    # --- state --------------------------------------------------------------------------

    def incr_counter(self, key: str, amount: int) -> None:
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"incr_counter({key!r}, ...) needs an int, got {type(amount).__name__}")
        self._state.incr(key, amount)

    def get_counter(self, key: str) -> int:
        return self._state.get_counter(key)

    def del_counter(self, key: str) -> None:
        self._state.delete(key)

    def put_state(self, key: str, value: Any) -> None:
        if isinstance(value, str):
            value = value.encode()
        if not isinstance(value, bytes | bytearray):
            raise TypeError(
                f"put_state({key!r}, ...) needs str or bytes, got {type(value).__name__}"
            )
        self._state.put(key, bytes(value))

    def get_state(self, key: str) -> bytes | None:
        return self._state.get(key)
