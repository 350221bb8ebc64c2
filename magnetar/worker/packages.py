"""Function code packages: stored on the broker, content-addressed, cached on each worker's disk.

A package is one code file (a ``.py`` or a ``.zip``) written to the packages topic as
consecutive messages of ``chunk_bytes`` each, from one producer, without batching. Every
chunk carries the properties ``sha256``, ``chunk`` (index), ``chunks`` (count), ``filename``,
``size`` and ``upload_id``. A :class:`PackageRef` names the package's sha256 and the message
id of its first chunk, so any worker — one that never saw the upload included — opens a
reader right there and reassembles the file. The topic holds nothing else a worker needs:
no compaction, no admin API, no broker-side deduplication.

``upload_id`` tells two uploads of the same content apart: when two workers upload it at
the same moment (perhaps with different chunk sizes) their chunks interleave, and a
reader must not mix them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import pulsar

from magnetar.client import open_reader
from magnetar.positions import Position, position
from magnetar.topics import full_topic_name
from magnetar.worker.exceptions import PackageError

__all__ = ["DEFAULT_CHUNK_BYTES", "MAX_CHUNK_BYTES", "PackageRef", "PackageStore"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 1 << 20
MAX_CHUNK_BYTES = 4 << 20
"""pulsar-lite (like Pulsar by default) refuses messages over 5 MiB, properties included."""

_INDEX_FILE = "index.json"
_CONFIRM_TIMEOUT_S = 2.0
_READER_QUEUE_SIZE = 8  # chunks are up to MAX_CHUNK_BYTES each: prefetch only a few
_STALL_S = 2.0  # no chunk for this long: the reader is stuck, open a new one
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PackageRef:
    """Where a function's code package lives: what a function record stores."""

    sha256: str
    """Hex SHA-256 of the content: the package's identity."""
    size: int
    """Content length in bytes."""
    filename: str
    """The original file name (``exclamation.py``, ``fn.zip``): the loader goes by its suffix."""
    message_id: str
    """Base64 of the first chunk's ``MessageId.serialize()`` on the packages topic."""

    def __post_init__(self) -> None:
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise PackageError(f"invalid package sha256 {self.sha256!r}: expected 64 hex digits")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise PackageError(f"invalid size {self.size!r} of package {self.sha256}")
        _check_filename(self.filename)
        if not isinstance(self.message_id, str) or not self.message_id:
            raise PackageError(f"package {self.sha256} has no message id")

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "size": self.size,
            "filename": self.filename,
            "messageId": self.message_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PackageRef:
        """The reference ``to_json`` wrote; a malformed one raises :class:`PackageError`."""
        try:
            return cls(
                sha256=data["sha256"],
                size=data["size"],
                filename=data["filename"],
                message_id=data["messageId"],
            )
        except (KeyError, TypeError) as error:
            raise PackageError(f"invalid package reference {data!r}: {error!r}") from None


class PackageStore:
    """Uploads code packages to the packages topic and fetches them into a local cache.

    The cache holds ``<cache_dir>/<sha256>/<filename>`` plus an index of the references this
    worker uploaded. Thread-safe: calls for one package are serialized, so concurrent
    fetches of a package download it once.
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        cache_dir: Path,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        fetch_timeout: float = 30.0,
    ) -> None:
        if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise PackageError(
                f"chunk_bytes must be between 1 and {MAX_CHUNK_BYTES} (the broker's message "
                f"size limit leaves room for no more), got {chunk_bytes}"
            )
        self._client = client
        self._topic = full_topic_name(topic)
        self._cache_dir = Path(cache_dir)
        self._chunk_bytes = chunk_bytes
        self._fetch_timeout = fetch_timeout
        self._lock = threading.Lock()  # guards _index and _package_locks
        self._package_locks: dict[str, threading.Lock] = {}
        self._index = self._load_index()

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def cache_dir(self) -> Path:
        return self._cache_dir

    def upload(self, data: bytes, filename: str) -> PackageRef:
        """Store ``data`` on the topic (once all chunks are persisted) and in the local cache."""
        _check_filename(filename)
        if not data:
            raise PackageError(f"function package {filename} is empty: upload the code file")
        sha256 = hashlib.sha256(data).hexdigest()
        with self._package_lock(sha256):
            known = self._known_ref(sha256)
            # The index outlives the broker's data (a fresh standalone broker, another
            # cluster), so a known reference is reused only once the topic confirms it.
            if known is not None and self._is_on_topic(known):
                ref = replace(known, filename=filename)
            else:
                ref = self._publish(data, sha256, filename)
                self._remember(ref)
            path = self._path(ref)
            if not self._is_intact(path, ref):
                with _atomic_file(path) as out:
                    out.write(data)
        return ref

    def fetch(self, ref: PackageRef) -> Path:
        """The local path of the package's file, downloaded from the topic unless cached."""
        path = self._path(ref)
        with self._package_lock(ref.sha256):
            if self._is_intact(path, ref):
                return path
            start = _message_id(ref)
            where = f"topic {self._topic} from message {start}"
            digest = hashlib.sha256()
            size = 0
            chunks = self._chunks(ref, start, where, self._fetch_timeout)
            with contextlib.closing(chunks), _atomic_file(path) as out:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                if size != ref.size or digest.hexdigest() != ref.sha256:
                    raise PackageError(
                        f"package {ref.sha256} ({ref.filename}) read from {where} is corrupt: "
                        f"got {size} bytes with sha256 {digest.hexdigest()}, expected "
                        f"{ref.size} bytes; upload the function code again"
                    )
            log.info("downloaded package %s (%s, %d bytes)", ref.sha256, ref.filename, size)
            return path

    # --- the topic ----------------------------------------------------------------------

    def _publish(self, data: bytes, sha256: str, filename: str) -> PackageRef:
        count = -(-len(data) // self._chunk_bytes)
        properties = {
            "sha256": sha256,
            "chunks": str(count),
            "filename": filename,
            "size": str(len(data)),
            "upload_id": uuid.uuid4().hex,
        }
        try:
            producer = self._client.create_producer(self._topic, batching_enabled=False)
        except Exception as error:
            raise PackageError(
                f"cannot publish package {sha256} ({filename}) to {self._topic}: {error}"
            ) from error
        try:
            first: Any = None
            for index in range(count):
                chunk = data[index * self._chunk_bytes : (index + 1) * self._chunk_bytes]
                # A synchronous send returns once the broker has persisted the chunk.
                message_id = producer.send(chunk, properties={**properties, "chunk": str(index)})
                if index == 0:
                    first = message_id
        except Exception as error:
            raise PackageError(
                f"cannot publish package {sha256} ({filename}) to {self._topic}: {error}"
            ) from error
        finally:
            _close(producer, "producer")
        log.info(
            "uploaded package %s (%s, %d bytes, %d chunks) to %s",
            sha256,
            filename,
            len(data),
            count,
            self._topic,
        )
        return PackageRef(
            sha256=sha256,
            size=len(data),
            filename=filename,
            message_id=base64.b64encode(first.serialize()).decode("ascii"),
        )

    def _is_on_topic(self, ref: PackageRef) -> bool:
        """Whether the topic holds the first chunk of ``ref`` where ``ref`` says."""
        try:
            start = _message_id(ref)
            where = f"topic {self._topic} from message {start}"
            timeout = min(_CONFIRM_TIMEOUT_S, self._fetch_timeout)
            with contextlib.closing(self._chunks(ref, start, where, timeout)) as chunks:
                next(chunks)
        except PackageError as error:
            log.info("uploading package %s again: %s", ref.sha256, error)
            return False
        return True

    def _open_reader(self, start: Any, ref: PackageRef, where: str) -> Any:
        # Always a new reader, never seek(): seek() is unreliable on pulsar-lite.
        try:
            return open_reader(
                self._client,
                self._topic,
                start,
                start_message_id_inclusive=True,
                receiver_queue_size=_READER_QUEUE_SIZE,
            )
        except Exception as error:
            raise PackageError(
                f"cannot read package {ref.sha256} ({ref.filename}) from {where}: {error}"
            ) from error

    def _chunks(
        self, ref: PackageRef, start: Any, where: str, timeout: float
    ) -> Generator[bytes, None, None]:
        """The package's chunks in order, read from its first chunk at ``start``."""
        deadline = time.monotonic() + timeout
        resume_at = start
        last: Position | None = None
        upload_id: str | None = None
        count = 1
        index = 0
        reader = self._open_reader(start, ref, where)
        try:
            while index < count:
                remaining = deadline - time.monotonic()
                try:
                    message = reader.read_next(max(1, int(min(remaining, _STALL_S) * 1000)))
                except pulsar.Timeout:
                    if remaining <= _STALL_S:
                        raise PackageError(
                            f"package {ref.sha256} ({ref.filename}) was not found on {where} "
                            f"within {timeout:g} s (got {index} of its chunks); the reference "
                            "is stale or the broker lost the topic: upload the function code "
                            "again"
                        ) from None
                    # pulsar-lite readers now and then stop delivering mid-topic; a new
                    # reader from the last message taken carries on (that one comes again).
                    _close(reader, "reader")
                    reader = self._open_reader(resume_at, ref, where)
                    continue
                except Exception as error:
                    raise PackageError(
                        f"reading package {ref.sha256} ({ref.filename}) from {where} failed: "
                        f"{error}"
                    ) from error
                current = position(message.message_id())
                if last is not None and current <= last:
                    continue  # a redelivery
                last, resume_at = current, message.message_id()
                properties = message.properties()
                if index == 0:
                    if properties.get("sha256") != ref.sha256 or properties.get("chunk") != "0":
                        raise PackageError(
                            f"package {ref.sha256} ({ref.filename}) is not on {where}: the "
                            "message there is not its first chunk (a wrong or stale "
                            "reference); upload the function code again"
                        )
                    upload_id = properties.get("upload_id")
                    count = _int_property(properties, "chunks", ref, where)
                elif (
                    properties.get("sha256") != ref.sha256
                    or properties.get("upload_id") != upload_id
                ):
                    continue  # a chunk of another package, or of another upload of this one
                elif _int_property(properties, "chunk", ref, where) != index:
                    raise PackageError(
                        f"package {ref.sha256} ({ref.filename}) on {where} misses chunk "
                        f"{index} of {count}; upload the function code again"
                    )
                yield message.data()
                index += 1
        finally:
            _close(reader, "reader")

    # --- the local cache ----------------------------------------------------------------

    def _path(self, ref: PackageRef) -> Path:
        return self._cache_dir / ref.sha256 / ref.filename

    def _is_intact(self, path: Path, ref: PackageRef) -> bool:
        try:
            if path.stat().st_size == ref.size:
                with path.open("rb") as file:
                    if hashlib.file_digest(file, "sha256").hexdigest() == ref.sha256:
                        return True
        except FileNotFoundError:
            return False
        except OSError as error:
            log.warning("cannot read cached package %s: %s", path, error)
            return False
        log.warning("cached package %s is corrupt; fetching it again", path)
        return False

    def _package_lock(self, sha256: str) -> threading.Lock:
        with self._lock:
            return self._package_locks.setdefault(sha256, threading.Lock())

    def _known_ref(self, sha256: str) -> PackageRef | None:
        with self._lock:
            known = self._index.get(self._topic, {}).get(sha256)
        if known is None:
            return None
        try:
            return PackageRef.from_json(known)
        except PackageError as error:
            log.warning("ignoring a bad entry of the package index: %s", error)
            return None

    def _load_index(self) -> dict[str, dict[str, Any]]:
        """``{topic: {sha256: PackageRef JSON}}`` of uploads; unreadable means empty."""
        path = self._cache_dir / _INDEX_FILE
        try:
            index = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("ignoring the unreadable package index %s: %s", path, error)
            return {}
        if not isinstance(index, dict) or not all(isinstance(v, dict) for v in index.values()):
            log.warning("ignoring the malformed package index %s", path)
            return {}
        return index

    def _remember(self, ref: PackageRef) -> None:
        with self._lock:
            self._index.setdefault(self._topic, {})[ref.sha256] = ref.to_json()
            content = json.dumps(self._index, indent=1, sort_keys=True).encode()
            # Losing the index only costs a re-upload, so a failed write is not an error.
            try:
                with _atomic_file(self._cache_dir / _INDEX_FILE) as out:
                    out.write(content)
            except PackageError as error:
                log.warning("%s", error)


@contextlib.contextmanager
def _atomic_file(path: Path) -> Iterator[IO[bytes]]:
    """A temporary file renamed to ``path`` when the block succeeds, deleted when it fails.

    No fsync: a cached file that a crash left damaged fails the sha256 check and is fetched
    again.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as error:
        raise PackageError(f"cannot write {path}: {error}") from error
    try:
        with os.fdopen(descriptor, "wb") as out:
            yield out
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise PackageError(f"cannot write {path}: {error}") from error
        raise


def _check_filename(filename: str) -> None:
    # The name becomes a path in the cache: a bare file name only.
    if (
        not isinstance(filename, str)
        or filename in ("", ".", "..")
        or any(c in filename for c in "/\\\0")
    ):
        raise PackageError(
            f"invalid package file name {filename!r}: expected a bare name such as 'fn.py'"
        )


def _message_id(ref: PackageRef) -> Any:
    try:
        return pulsar.MessageId.deserialize(base64.b64decode(ref.message_id, validate=True))
    except (binascii.Error, ValueError) as error:
        raise PackageError(
            f"package {ref.sha256} ({ref.filename}) has an invalid message id "
            f"{ref.message_id!r}: {error}"
        ) from None


def _int_property(properties: Mapping[str, str], name: str, ref: PackageRef, where: str) -> int:
    try:
        value = int(properties[name])
    except (KeyError, ValueError):
        value = -1
    if value < 0 or (name == "chunks" and value == 0):
        raise PackageError(
            f"package {ref.sha256} ({ref.filename}) on {where} has a malformed chunk "
            f"(property {name}={properties.get(name)!r}); upload the function code again"
        )
    return value


def _close(resource: Any, what: str) -> None:
    try:
        resource.close()
    except Exception as error:
        log.debug("closing a package %s failed: %s", what, error)
