"""The workers' own identity: one cluster key, held by the workers only, that authenticates
the records they write to the system topics and the calls they make to each other.

On the broker anyone who may publish to a topic can write a record that looks like a
worker's (pulsar-lite has no authorization at all, and a function is a client of the broker).
So every record a worker writes to the metadata, assignments and coordination topics carries
an HMAC-SHA256 of its kind, properties and payload (:class:`RecordSeal`), and every worker
drops a record whose seal is missing or wrong. Calls on the internal paths carry an HMAC of
method, path, time and body (:class:`PeerSeal`), so a tenant's token cannot make them.

Replays of a genuine record are harmless: the metadata and assignments apply a record only
when its term and version are newer than what they hold, and a heartbeat only while its
send time is fresh.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from magnetar.worker.auth import read_key
from magnetar.worker.exceptions import AuthenticationError, WorkerConfigError

__all__ = [
    "MIN_KEY_BYTES",
    "PEER_HEADER",
    "SEAL_PROPERTY",
    "ClusterKey",
    "PeerSeal",
    "RecordSeal",
    "create_cluster_key_file",
]

log = logging.getLogger(__name__)

MIN_KEY_BYTES = 32
"""A shorter key would be guessable offline from one sealed record."""
SEAL_PROPERTY = "magnetar-seal"
"""The message property that carries a record's seal: ``v1:<base64url HMAC-SHA256>``."""
PEER_HEADER = "X-Magnetar-Worker"
"""The header of a call between workers: ``v1 <worker id> <unix time> <base64url HMAC>``."""
PEER_CLOCK_SKEW_S = 300.0
"""How far a call's time may be from the receiver's clock (workers' clocks differ)."""
_WARN_EVERY_S = 10.0


class ClusterKey:
    """The key the workers of one cluster share (never shown to an instance)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise WorkerConfigError(
                f"cluster_key has {len(key)} bytes, it needs at least {MIN_KEY_BYTES}: "
                "create one with `magnetar tokens create-secret-key --output cluster.key`"
            )
        self._key = key

    @classmethod
    def from_setting(cls, setting: str) -> ClusterKey:
        """The key of a ``cluster_key`` setting (file:///path, data:;base64,..., a path or
        base64, as ``token_secret_key``)."""
        return cls(read_key(setting))

    def derive(self, purpose: bytes) -> bytes:
        """A key of its own for ``purpose`` (so a seal's key never doubles as another's)."""
        return hmac.new(self._key, b"magnetar-derive-v1:" + purpose, hashlib.sha256).digest()

    def mac(self, *parts: bytes) -> str:
        """The HMAC-SHA256 of ``parts`` (length-prefixed, so no two splits collide)."""
        digest = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")


def create_cluster_key_file(path: Path) -> str:
    """A new random cluster key in ``path`` (readable by its owner only), unless one is
    there already; the ``cluster_key`` setting that names it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_bytes(secrets.token_bytes(MIN_KEY_BYTES))
    return path.resolve().as_uri()


class RecordSeal:
    """Seals the records this worker writes and checks those it reads.

    Without a key (authentication off and no ``cluster_key``) records go unsealed and every
    record is accepted, as before seals existed. ``accept_unsealed_history`` (upgrading a
    cluster whose topics hold records of a version without seals) accepts the unsealed
    records that come before a topic's first sealed one: all workers replay a topic in the
    same order, so they agree on which those are."""

    def __init__(self, key: ClusterKey | None, accept_unsealed_history: bool = False) -> None:
        self._key = key
        self._accept_history = accept_unsealed_history
        self._sealed_topics: set[str] = set()
        """Topics on which a sealed record was read: an unsealed one is forged from then on."""
        self._lock = threading.Lock()
        self._last_warning: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def seal(self, kind: str, data: bytes, properties: Mapping[str, str]) -> dict[str, str]:
        """``properties`` with the seal of a record of ``kind`` (``metadata``, ...) added."""
        sealed = dict(properties)
        if self._key is not None:
            sealed[SEAL_PROPERTY] = "v1:" + self._key.mac(*_record_parts(kind, data, properties))
        return sealed

    def accepts(self, kind: str, topic: str, message: Any) -> bool:
        """Whether ``message`` was written by a worker of this cluster; a rate-limited
        warning names the topic and message id of one that was not."""
        if self._key is None:
            return True
        properties = dict(message.properties())
        seal = properties.pop(SEAL_PROPERTY, "")
        expected = "v1:" + self._key.mac(*_record_parts(kind, message.data(), properties))
        if hmac.compare_digest(seal.encode(), expected.encode()):
            with self._lock:
                self._sealed_topics.add(topic)
            return True
        if not seal and self._accept_history:
            with self._lock:
                if topic not in self._sealed_topics:
                    return True
        self._warn(topic, message.message_id(), "missing" if not seal else "wrong")
        return False

    def _warn(self, topic: str, message_id: Any, problem: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._dropped[topic] = self._dropped.get(topic, 0) + 1
            if now - self._last_warning.get(topic, -_WARN_EVERY_S) < _WARN_EVERY_S:
                return
            self._last_warning[topic] = now
            dropped, self._dropped[topic] = self._dropped[topic], 0
        log.warning(
            "dropped a record on %s (message %s) whose seal is %s: it was not written by a "
            "worker of this cluster (%d dropped since the last warning)",
            topic,
            message_id,
            problem,
            dropped,
        )


def _record_parts(kind: str, data: bytes, properties: Mapping[str, str]) -> tuple[bytes, ...]:
    # Every property counts: a worker reads type, key, term, leader and version from them.
    canonical = json.dumps(sorted(properties.items()), separators=(",", ":"))
    return b"magnetar-record-v1", kind.encode(), canonical.encode(), data


class PeerSeal:
    """Signs this worker's calls to other workers and checks the calls it receives."""

    def __init__(self, key: ClusterKey | None, worker_id: str) -> None:
        self._key = key
        self._worker_id = worker_id

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """The header that proves a call to ``path`` (with its query) comes from a worker."""
        if self._key is None:
            return {}
        now = str(int(time.time()))
        mac = self._key.mac(*_call_parts(method, path, now, self._worker_id, body))
        return {PEER_HEADER: f"v1 {self._worker_id} {now} {mac}"}

    def verify(self, method: str, path: str, body: bytes, header: str | None) -> str:
        """The calling worker's id; AuthenticationError unless the header proves the call
        comes from a worker of this cluster, lately."""
        if self._key is None:
            return ""
        if not header:
            raise AuthenticationError(
                f"{path} is for the cluster's workers only: a token cannot call it"
            )
        try:
            version, worker_id, sent, mac = header.split(" ")
            sent_at = float(sent)
        except ValueError:
            raise AuthenticationError(f"malformed {PEER_HEADER} header") from None
        expected = self._key.mac(*_call_parts(method, path, sent, worker_id, body))
        if version != "v1" or not hmac.compare_digest(mac.encode(), expected.encode()):
            raise AuthenticationError(f"the {PEER_HEADER} header is not a worker's of this cluster")
        if abs(time.time() - sent_at) > PEER_CLOCK_SKEW_S:
            raise AuthenticationError(
                f"the {PEER_HEADER} header is {time.time() - sent_at:.0f}s old: a call between "
                f"workers is valid for {PEER_CLOCK_SKEW_S:.0f}s (are the clocks in sync?)"
            )
        return worker_id


def _call_parts(
    method: str, path: str, sent: str, worker_id: str, body: bytes
) -> tuple[bytes, ...]:
    return (
        b"magnetar-call-v1",
        method.upper().encode(),
        path.encode(),
        sent.encode(),
        worker_id.encode(),
        hashlib.sha256(body).digest(),
    )
