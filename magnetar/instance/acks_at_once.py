"""Consumers whose acknowledgements go to the broker at once instead of 100 ms later.

pulsar-client groups a consumer's acknowledgements and sends them every 100 ms (the C++
client's ``ackGroupingTimeMs``); its Python binding has no setting for that. On a Shared
subscription of pulsar-lite 0.2 the grouping is what makes the broker slow: it hands the
subscription's messages to its consumers in turn, so each consumer's 100 ms of held
acknowledgements leave gaps between the others', and pulsar-lite reads and rewrites the whole
list of gaps for every message it acknowledges and dispatches. Three instances sharing a
subscription drained a backlog at 10,000 msg/s with their acknowledgements grouped and
20,000 msg/s with them sent at once, the broker spending 91 then 41 us a message
(``bench/shared_prefetch.py``); at a steady 10,000 msg/s a 3-worker cluster fell 0.7-1.7 s
behind with them grouped, and kept up sent at once.

The setting is reached in the library the binding loads. pybind11's conduit
(``_pybind11_conduit_v1_``, what pybind11 offers other code) hands out the C++
``pulsar::ConsumerConfiguration`` behind a ``_pulsar.ConsumerConfiguration``; it matches
C++ types by name, so a ``std::type_info`` holding only that name asks for it. The setter
is called by its exported name and read back by its getter. ``acking_at_once(client)`` is a
copy of the client whose binding sets it on the configuration ``subscribe`` builds. Where
any step fails (another pulsar-client), it warns once and subscribes as pulsar-client does.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import logging
from typing import Any

import _pulsar
import pulsar

__all__ = ["ack_grouping_ms", "acking_at_once", "acknowledge_at_once"]

log = logging.getLogger(__name__)

_ABI = b"system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1"
"""The ABI the wheel's pybind11 was built for (its conduit declines another)."""
_CONFIGURATION = b"N6pulsar21ConsumerConfigurationE"
_SET = "_ZN6pulsar21ConsumerConfiguration20setAckGroupingTimeMsEl"
_GET = "_ZNK6pulsar21ConsumerConfiguration20getAckGroupingTimeMsEv"
_A_TYPE_INFO = "_ZTIN6pulsar8ProducerE"
"""A std::type_info the binding exports, whose vtable the made-up one borrows."""


class _Library:
    """The library's setter and getter, and a ``std::type_info`` naming the C++ type."""

    def __init__(self) -> None:
        binding = ctypes.CDLL(_pulsar.__file__)  # already loaded: the same handle
        self.set_ms = binding[_SET]
        self.set_ms.argtypes = [ctypes.c_void_p, ctypes.c_long]
        self.set_ms.restype = None
        self.get_ms = binding[_GET]
        self.get_ms.argtypes = [ctypes.c_void_p]
        self.get_ms.restype = ctypes.c_long
        vtable = ctypes.c_void_p.in_dll(binding, _A_TYPE_INFO).value
        self._name = ctypes.create_string_buffer(_CONFIGURATION)
        self._type_info = (ctypes.c_void_p * 2)(vtable, ctypes.addressof(self._name))
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        new_capsule.restype = ctypes.py_object
        self._capsule = new_capsule(ctypes.addressof(self._type_info), b"St9type_info", None)
        self._pointer = ctypes.pythonapi.PyCapsule_GetPointer
        self._pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        self._pointer.restype = ctypes.c_void_p

    def native(self, configuration: Any) -> int:
        """The C++ object's address behind a ``_pulsar.ConsumerConfiguration``."""
        handed = configuration._pybind11_conduit_v1_(_ABI, self._capsule, b"raw_pointer_ephemeral")
        if handed is None:
            raise TypeError("the binding does not hand out its C++ ConsumerConfiguration")
        address: int = self._pointer(handed, _CONFIGURATION)
        return address


@functools.cache
def _library() -> _Library:
    return _Library()


def ack_grouping_ms(configuration: Any) -> int:
    """How long the consumer made from ``configuration`` groups acknowledgements."""
    library = _library()
    grouping: int = library.get_ms(library.native(configuration))
    return grouping


def acknowledge_at_once(configuration: Any) -> Any:
    """``configuration`` (a ``_pulsar.ConsumerConfiguration``), set to send each
    acknowledgement at once."""
    library = _library()
    native = library.native(configuration)
    library.set_ms(native, 0)
    if library.get_ms(native) != 0:
        raise TypeError("the C++ ConsumerConfiguration kept its acknowledgement grouping")
    return configuration


class _SubscribingAtOnce:
    """A client's ``_pulsar.Client``, setting every consumer it makes to acknowledge at
    once; everything else is the binding's."""

    def __init__(self, binding: Any) -> None:
        self._binding = binding

    def subscribe(self, topic: str, name: str, configuration: Any) -> Any:
        return self._binding.subscribe(topic, name, acknowledge_at_once(configuration))

    def subscribe_topics(self, topics: list[str], name: str, configuration: Any) -> Any:
        return self._binding.subscribe_topics(topics, name, acknowledge_at_once(configuration))

    def subscribe_pattern(self, pattern: str, name: str, configuration: Any) -> Any:
        return self._binding.subscribe_pattern(pattern, name, acknowledge_at_once(configuration))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)


def acking_at_once(client: pulsar.Client) -> pulsar.Client:
    """``client``, subscribing consumers that acknowledge at once; ``client`` itself where
    the library cannot be set so."""
    try:
        acknowledge_at_once(_pulsar.ConsumerConfiguration())
    except (AttributeError, OSError, TypeError, ValueError) as error:
        _declined(str(error))
        return client
    acking = copy.copy(client)  # shares its binding and its list of consumers
    acking._client = _SubscribingAtOnce(client._client)
    return acking


@functools.cache
def _declined(reason: str) -> None:
    log.warning(
        "instances sharing a subscription group their acknowledgements for 100 ms: "
        "pulsar-client %s cannot be set to send them at once (%s)",
        getattr(pulsar, "__version__", ""),
        reason,
    )
