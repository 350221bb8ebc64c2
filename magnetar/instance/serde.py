"""SerDe: turning message payloads into the values a function sees, and its results back.

The default is Apache Pulsar's ``IdentitySerDe`` (str as UTF-8, int/float/complex as text,
bytes unchanged) with a faster decode path that returns exactly what it returns.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

from pulsar.functions.serde import IdentitySerDe

from magnetar.instance.exceptions import FunctionLoadError, SerDeError
from magnetar.instance.loader import load_attribute
from magnetar.topics import base_topic

__all__ = ["FastIdentitySerDe", "SerDe", "TopicSerDes", "load_serde"]

_NUMERIC_LETTERS = frozenset("iInNjJ")  # inf, nan, j: letters that may start a number
_NUMBER_TYPES = (int, float, complex)
_IN_NUMBERS = frozenset("0123456789+-._eEjJ()infatyINFATY \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f")
"""The ASCII characters int(), float() or complex() may accept in a text (digits, signs,
points, exponents, parentheses, the letters of inf, infinity and nan, and whitespace)."""
_NOT_IN_NUMBERS = re.compile(
    "[" + re.escape("".join(c for c in map(chr, range(128)) if c not in _IN_NUMBERS)) + "]"
)


class SerDe(Protocol):
    """What Pulsar's ``pulsar.functions.serde.SerDe`` classes implement."""

    def serialize(self, input: Any) -> bytes: ...

    def deserialize(self, input_bytes: bytes) -> Any: ...


class FastIdentitySerDe(IdentitySerDe):  # type: ignore[misc]
    """IdentitySerDe's results, without raising three exceptions for every plain string
    (one that starts with a letter, or holds a character no number can)."""

    def serialize(self, input: Any) -> bytes:
        kind = type(input)
        if kind is str:
            return input.encode()  # type: ignore[no-any-return]
        if kind is bytes:
            return input  # type: ignore[no-any-return]
        if kind in _NUMBER_TYPES:
            return str(input).encode()
        raise SerDeError(
            f"IdentitySerDe cannot serialize a value of type {kind.__name__}: return str, "
            "bytes or a number, or set outputSerdeClassName"
        )

    def deserialize(self, input_bytes: bytes) -> Any:
        try:
            text = input_bytes.decode()
        except UnicodeDecodeError:
            return input_bytes
        if text and text[0].isalpha() and text[0] not in _NUMERIC_LETTERS:
            return text
        if _NOT_IN_NUMBERS.search(text):  # JSON, "12:30", "1,000": a string, no exceptions
            return text
        for kind in _NUMBER_TYPES:
            try:
                return kind(text)
            except Exception:
                pass
        return text


class TopicSerDes(dict[str, SerDe]):
    """Input topic -> its SerDe. A topic seen for the first time (a pattern match or a
    partition) takes its base topic's SerDe, or the default."""

    def __init__(self, serdes: dict[str, SerDe], default: SerDe) -> None:
        super().__init__(serdes)
        self._default = default

    def __missing__(self, topic: str) -> SerDe:
        serde = self.get(base_topic(topic), self._default)
        self[topic] = serde
        return serde


_SDK_ALIASES = {
    "serde.IdentitySerDe": "pulsar.functions.serde.IdentitySerDe",
    "serde.PickleSerDe": "pulsar.functions.serde.PickleSerDe",
}


def load_serde(class_name: str | None, search_paths: list[Path] | None = None) -> SerDe:
    """An instance of the named SerDe class (``module.ClassName``); the default when None."""
    if not class_name:
        return FastIdentitySerDe()
    target = _SDK_ALIASES.get(class_name, class_name)
    try:
        cls = load_attribute(target, search_paths or [])
    except FunctionLoadError as error:
        raise SerDeError(f"cannot load SerDe class {class_name!r}: {error}") from None
    if cls is IdentitySerDe:
        return FastIdentitySerDe()
    if not isinstance(cls, type):
        raise SerDeError(f"SerDe {class_name!r} is not a class")
    try:
        serde = cls()
    except Exception as error:
        raise SerDeError(f"cannot create SerDe {class_name!r}: {error!r}") from None
    if not (
        callable(getattr(serde, "serialize", None))
        and callable(getattr(serde, "deserialize", None))
    ):
        raise SerDeError(f"SerDe {class_name!r} must define serialize() and deserialize()")
    return serde  # type: ignore[no-any-return]
