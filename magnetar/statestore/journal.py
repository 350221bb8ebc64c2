"""Where a function's state lives on the broker, and writing to its journal directly.

Instances send their journal messages through their own delivery mechanism (so an input is
acknowledged only once its record is persisted); ``JournalWriter`` is for the rest: state put
through the REST API and the CLEAR that deletes a function's state.
"""

from __future__ import annotations

import logging
import random
import re
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
    "unescaped_journal_topic",
]

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "public/magnetar"
"""The system namespace the journals live in unless a worker is configured otherwise."""


_KEPT = re.compile(r"[A-Za-z0-9_.]")
"""What a part of a state topic name keeps as it is; the rest is escaped."""


def _parts(fqfn: str) -> tuple[str, str, str]:
    tenant, namespace, name = fqfn.split("/")
    return tenant, namespace, name


def _escape(part: str) -> str:
    """``part`` with every character but letters, digits, '_' and '.' written as '=' and
    the hex of its UTF-8 bytes (``a-b`` -> ``a=2Db``): no escaped part holds '-', so the
    parts joined by '-' name one function only, and a name without such characters stays
    as it was before the escaping."""
    return "".join(
        char if _KEPT.fullmatch(char) else "".join(f"={byte:02X}" for byte in char.encode())
        for char in part
    )


def _function_part(fqfn: str) -> str:
    return "-".join(_escape(part) for part in _parts(fqfn))


def journal_topic(fqfn: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``persistent://<namespace>/state-<tenant>-<namespace>-<name>``: a function's journal,
    each part escaped (see ``_escape``), so that no two functions share it."""
    return f"persistent://{namespace}/state-{_function_part(fqfn)}"


def snapshot_topic(fqfn: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``persistent://<namespace>/snapshots-<tenant>-<namespace>-<name>``: snapshots of a
    function's table (a prefix no journal has, so no function's journal collides with it),
    each part escaped as in :func:`journal_topic`."""
    return f"persistent://{namespace}/snapshots-{_function_part(fqfn)}"


def unescaped_journal_topic(fqfn: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The journal's name in Magnetar 0.1.0, its parts joined unescaped (``state-a-b-c`` for
    both ``a/b-c`` and ``a-b/c``): where ``statestore.upgrade`` carries a journal over from."""
    return f"persistent://{namespace}/state-{'-'.join(_parts(fqfn))}"


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
