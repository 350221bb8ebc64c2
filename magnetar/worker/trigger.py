"""Triggering a function: publish a value to one of its inputs, return what it outputs for it.

As in Apache Pulsar, a reader on the output topic is opened *before* the value is published
(so the output cannot be missed), and the output is recognised by the properties every
instance sets: ``__pfn_input_topic__`` and ``__pfn_input_msg_id__``.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import pulsar

from magnetar.client import open_reader
from magnetar.instance.config import FunctionConfig
from magnetar.topics import full_topic_name
from magnetar.worker.exceptions import TriggerError, TriggerTimeoutError

__all__ = ["FunctionTrigger"]

_INPUT_TOPIC = "__pfn_input_topic__"
_INPUT_MSG_ID = "__pfn_input_msg_id__"
_READ_MS = 200


class FunctionTrigger:
    """Publishes trigger values with the worker's client."""

    def __init__(self, client: pulsar.Client) -> None:
        self._client = client

    def trigger(
        self, config: FunctionConfig, value: bytes, topic: str | None, timeout_s: float
    ) -> bytes | None:
        """The function's output for ``value`` published to ``topic`` (default: its only
        input); None when the function has no output topic. Raises TriggerError (400) for a
        topic that is not an input, or none given when there are several, and
        TriggerTimeoutError (408) when no output arrives within ``timeout_s``; the reasons
        are Apache Pulsar's."""
        inputs = list(config.input_serdes())
        if topic is None:
            if len(inputs) + len(config.input_patterns()) > 1:
                raise TriggerError("Function in trigger function has more than 1 input topics")
            if not inputs:
                raise TriggerError("Function in trigger function has unidentified topic")
            target = inputs[0]
        else:
            target = _input(topic, inputs)
        reader = None
        try:
            if config.output:
                reader = open_reader(
                    self._client, full_topic_name(config.output), pulsar.MessageId.latest
                )
            producer = self._client.create_producer(target, batching_enabled=False)
            try:
                sent = producer.send(value)
            finally:
                producer.close()
            if reader is None:
                return None
            return _await_output(reader, target, sent, timeout_s)
        except pulsar.PulsarException as error:
            raise TriggerError(f"cannot trigger {config.fqfn}: {error}") from None
        finally:
            if reader is not None:
                reader.close()


def _input(topic: str, inputs: list[str]) -> str:
    unidentified = TriggerError("Function in trigger function has unidentified topic")
    try:
        full = full_topic_name(topic)
    except ValueError:
        raise unidentified from None
    if full not in inputs:
        raise unidentified
    return full


def _await_output(reader: Any, topic: str, sent: Any, timeout_s: float) -> bytes:
    wanted = (sent.ledger_id(), sent.entry_id())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            message = reader.read_next(_READ_MS)
        except pulsar.Timeout:
            continue
        properties = message.properties()
        if properties.get(_INPUT_TOPIC) == topic and _source(properties) == wanted:
            data: bytes = message.data()
            return data
    raise TriggerTimeoutError("Request Timed Out")


def _source(properties: dict[str, str]) -> tuple[int, int] | None:
    """(ledger, entry) of the input an output was made from."""
    try:
        source = pulsar.MessageId.deserialize(base64.b64decode(properties.get(_INPUT_MSG_ID, "")))
    except (binascii.Error, ValueError, pulsar.PulsarException):
        return None
    return source.ledger_id(), source.entry_id()
