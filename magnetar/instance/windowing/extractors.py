"""Timestamp extractors: where an event-time window reads an input's time.

As in Pulsar's Java SDK, a class with ``extract_timestamp(input) -> int`` (milliseconds)
reads it from the input's value. A class may instead define
``extract_message_timestamp(message) -> int`` to read it from the ``pulsar.Message``; the
built-in ``EventTime`` does, so windows can follow the time producers put on their messages.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.loader import load_attribute

__all__ = ["EventTime", "TimestampOf", "load_timestamp_extractor"]

TimestampOf = Callable[[Any, Any], int]
"""(value, message) -> the input's event time in ms."""


class EventTime:
    """The message's event time (``event_timestamp`` as the producer set it), or its publish
    time when the producer set none: ``--timestamp-extractor
    magnetar.instance.windowing.EventTime``."""

    def extract_message_timestamp(self, message: Any) -> int:
        return int(message.event_timestamp() or message.publish_timestamp())


def load_timestamp_extractor(class_name: str, search_paths: list[Path]) -> TimestampOf:
    """The extractor named ``module.Class``, from the function's code or installed modules."""
    where = f"timestamp extractor {class_name!r}"
    try:
        cls = load_attribute(class_name, search_paths)
    except FunctionLoadError as error:
        raise FunctionLoadError(f"cannot load {where}: {error}") from None
    if not isinstance(cls, type):
        raise FunctionLoadError(f"{where} is not a class")
    try:
        extractor = cls()
    except Exception as error:
        raise FunctionLoadError(
            f"creating {where} failed: {type(error).__name__}: {error}"
        ) from None
    of_message = getattr(extractor, "extract_message_timestamp", None)
    if callable(of_message):
        return lambda value, message: _milliseconds(of_message(message))
    of_value = getattr(extractor, "extract_timestamp", None)
    if callable(of_value):
        return lambda value, message: _milliseconds(of_value(value))
    raise FunctionLoadError(
        f"{where} has no extract_timestamp(input) method returning the input's time in ms"
    )


def _milliseconds(timestamp: Any) -> int:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(
            f"the timestamp extractor returned {timestamp!r}: it must return an int of milliseconds"
        )
    return timestamp
