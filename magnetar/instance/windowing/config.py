"""``windowConfig``: Apache Pulsar's WindowConfig, with its defaults and its validation messages.

Pulsar fills in what a window config leaves out (``WindowConfigUtils.inferMissingArguments``):
a window without a sliding interval is tumbling (it slides by its own length), and an
event-time window (one with a timestamp extractor) has a lag of 0 ms and emits watermarks
every second. The checks and their messages are ``WindowConfigUtils.validate``'s.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

__all__ = ["DEFAULT_MAX_LAG_MS", "DEFAULT_WATERMARK_EMIT_INTERVAL_MS", "WindowConfig"]

DEFAULT_MAX_LAG_MS = 0
"""Pulsar's default lag of event time: none."""
DEFAULT_WATERMARK_EMIT_INTERVAL_MS = 1000
"""Pulsar's default interval between two watermarks."""


class WindowConfig(BaseModel):
    """How a function's inputs are grouped into windows (Pulsar's ``windowConfig``)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )

    window_length_count: int | None = None
    """A window holds this many messages (``--window-length-count``)."""
    window_length_duration_ms: int | None = None
    """A window spans this many milliseconds (``--window-length-duration-ms``)."""
    sliding_interval_count: int | None = None
    """A window fires every this many messages (``--sliding-interval-count``)."""
    sliding_interval_duration_ms: int | None = None
    """A window fires every this many milliseconds (``--sliding-interval-duration-ms``)."""
    late_data_topic: str | None = None
    """Where messages too late for their event-time window go (``--late-data-topic``)."""
    max_lag_ms: int | None = None
    """How far event time may lag behind the newest event before a message is late
    (``--lag-ms``)."""
    watermark_emit_interval_ms: int | None = None
    """How often event time advances (``--watermark-emit-interval-ms``)."""
    timestamp_extractor_class_name: str | None = None
    """``module.Class`` whose ``extract_timestamp(input)`` gives an input's event time in ms;
    windows then follow event time instead of arrival time (``--timestamp-extractor``)."""
    actual_window_function_class_name: str | None = None
    """Kept as Pulsar fills it in; the function is the config's ``className``."""
    processing_guarantees: str | None = None
    """Kept as Pulsar fills it in; the config's ``processingGuarantees`` applies."""

    @model_validator(mode="before")
    @classmethod
    def _infer(cls, data: Any) -> Any:
        return _with_defaults(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _validate(self) -> WindowConfig:
        _validate(self)
        return self

    @property
    def event_time(self) -> bool:
        """Whether windows follow the inputs' event time (a timestamp extractor is set)."""
        return self.timestamp_extractor_class_name is not None

    @property
    def count_triggered(self) -> bool:
        """Whether windows fire after a number of messages (else after a duration)."""
        return self.sliding_interval_count is not None


def _validate(config: WindowConfig) -> None:
    length_count, length_ms = config.window_length_count, config.window_length_duration_ms
    if length_count is None and length_ms is None:
        raise ValueError("Window length is not specified")
    if length_count is not None and length_ms is not None:
        raise ValueError("Window length for time and count are set! Please set one or the other.")
    for length in (length_count, length_ms):
        if length is not None and length <= 0:
            raise ValueError(f"Window length must be positive [{length}]")
    for interval in (config.sliding_interval_count, config.sliding_interval_duration_ms):
        if interval is not None and interval <= 0:
            raise ValueError(f"Sliding interval must be positive [{interval}]")
    if config.timestamp_extractor_class_name is not None:
        if config.max_lag_ms is not None and config.max_lag_ms < 0:
            raise ValueError(f"Lag duration must be positive [{config.max_lag_ms}]")
        interval = config.watermark_emit_interval_ms
        if interval is not None and interval <= 0:
            raise ValueError(f"Watermark interval must be positive [{interval}]")
        if "." not in config.timestamp_extractor_class_name.strip("."):
            raise ValueError(
                f"timestampExtractorClassName {config.timestamp_extractor_class_name!r} must "
                "name a class as module.ClassName"
            )
    elif config.late_data_topic is not None:
        raise ValueError(
            "Late data topic can be defined only when specifying a timestamp extractor class"
        )


def _with_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Pulsar's defaults for what a window config (camelCase or snake_case fields) leaves out.
    Unlike Pulsar, a sliding interval of one kind is not added beside one of the other kind:
    Pulsar's runtime would then fire by count and ignore the duration given."""

    def given(field: str) -> Any:
        return data.get(to_camel(field), data.get(field))

    update: dict[str, Any] = {}
    if given("sliding_interval_count") is None and given("sliding_interval_duration_ms") is None:
        if given("window_length_count") is not None:
            update["slidingIntervalCount"] = given("window_length_count")
        if given("window_length_duration_ms") is not None:
            update["slidingIntervalDurationMs"] = given("window_length_duration_ms")
    if given("timestamp_extractor_class_name") is not None:
        if given("max_lag_ms") is None:
            update["maxLagMs"] = DEFAULT_MAX_LAG_MS
        if given("watermark_emit_interval_ms") is None:
            update["watermarkEmitIntervalMs"] = DEFAULT_WATERMARK_EMIT_INTERVAL_MS
    if not update:
        return data
    return {**{k: v for k, v in data.items() if v is not None}, **update}
