"""Where a function's state lives on the broker, and writing to its journal directly.

Instances send their journal messages through their own delivery mechanism (so an input is
acknowledged only once its record is persisted); ``JournalWriter`` is for the rest: state put
through the REST API and the CLEAR that deletes a function's state.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from typing import Any

import pulsar

from magnetar.client import subscribe
from magnetar.positions import position
from magnetar.statestore.exceptions import StateJournalError
from magnetar.statestore.records import Op, encode_message, encode_record

__all__ = [
    "DEFAULT_NAMESPACE",
    "JournalWriter",
    "journal_topic",
    "last_message_id",
    "new_writer_id",
    "snapshot_topic",
]

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "public/magnetar"
"""The system namespace the journals live in unless a worker is configured otherwise."""


def _parts(fqfn: str) -> tuple[str, str, str]:
    tenant, namespace, name = fqfn.split("/")
    return tenant, namespace, name


def journal_topic(fqfn: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``persistent://<namespace>/state-<tenant>-<namespace>-<name>``: a function's journal."""
    tenant, function_namespace, name = _parts(fqfn)
    return f"persistent://{namespace}/state-{tenant}-{function_namespace}-{name}"


def snapshot_topic(fqfn: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``persistent://<namespace>/snapshots-<tenant>-<namespace>-<name>``: snapshots of a
    function's table (a prefix no journal has, so no function's journal collides with it)."""
    tenant, function_namespace, name = _parts(fqfn)
    return f"persistent://{namespace}/snapshots-{tenant}-{function_namespace}-{name}"


def last_message_id(client: pulsar.Client, topic: str) -> Any:
    """The topic's last message id, None when it is empty. Only consumers can ask for it, so
    this takes a throwaway subscription."""
    consumer = subscribe(client, topic, f"magnetar-last-id-{uuid.uuid4().hex[:12]}")
    try:
        last = consumer.get_last_message_id()
    except Exception:
        return None  # the embedded broker cannot name the last message of an empty topic
    finally:
        try:
            consumer.unsubscribe()
        except Exception as error:
            log.debug("removing the subscription on %s failed: %s", topic, error)
            consumer.close()
    return None if position(last)[1] < 0 else last


def new_writer_id() -> int:
    """A random 64-bit id for one writing process."""
    return random.getrandbits(64)


class JournalWriter:
    """Sends single records to one journal and returns each one's message id."""

    def __init__(self, client: pulsar.Client, topic: str, timeout_s: float = 10.0) -> None:
        self._client = client
        self._topic = topic
        self._timeout_s = timeout_s
        self._writer_id = new_writer_id()
        self._seq = 0
        self._lock = threading.Lock()
        self._producer: Any = None

    def write(self, ops: list[Op], epoch: int) -> Any:
        """Journal ``ops`` as one record; the message id once the broker has persisted it."""
        with self._lock:
            self._seq += 1
            record = encode_record(self._seq, b"", (-1, -1, -1), ops)
            payload = encode_message(self._writer_id, epoch, False, [record])
            try:
                if self._producer is None:
                    self._producer = self._client.create_producer(
                        self._topic,
                        batching_enabled=False,
                        send_timeout_millis=int(self._timeout_s * 1000),
                    )
                return self._producer.send(payload)
            except Exception as error:
                raise StateJournalError(
                    f"cannot write to the state journal {self._topic}: {error}"
                ) from None

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                try:
                    self._producer.close()
                except Exception as error:
                    log.debug("closing the journal producer failed: %s", error)
                self._producer = None
