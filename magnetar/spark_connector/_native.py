"""The native read path: a range read by Magnetar's Rust reader straight into Arrow buffers.

The reader (``native/spark_reader``, built by ``make install`` into ``_native_reader.so``
beside this module, loaded with ``ctypes``) speaks Pulsar's binary protocol itself and fills
the columns message by message in native code; Python wraps each batch's buffers into a
``pyarrow.RecordBatch``, a cost per batch, not per message. It reads by the rules of
:func:`._ranges.read_range` (the same rows, the same ranges).

It covers plain ``pulsar://`` connections with no authentication or a token, and messages
that are not compressed, encrypted or chunked. Anything else goes to the Python path: a
whole range when its settings need the Python client, or the rest of a range from the first
message the native reader cannot decode. Either is logged once per process and reason, as
is a library that was not built.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pulsar
import pyarrow as pa

from magnetar.spark_connector._offsets import Position
from magnetar.spark_connector._ranges import (
    RangePartition,
    ReadSettings,
    lost,
    read_range,
    resolved_end,
)
from magnetar.spark_connector._schema import arrow_schema, describe_id, record_batches
from magnetar.spark_connector._values import ValueDecoder
from magnetar.spark_connector.exceptions import PulsarReadError

__all__ = [
    "LIBRARY",
    "native_available",
    "native_batches",
    "native_refusal",
]

log = logging.getLogger(__name__)


LIBRARY = Path(
    os.environ.get("MAGNETAR_SPARK_NATIVE_READER") or Path(__file__).with_name("_native_reader.so")
)
"""The built reader (``MAGNETAR_SPARK_NATIVE_READER`` names another file)."""

_BATCH, _DONE, _STALLED, _UNSUPPORTED, _FAILED = 0, 1, 2, 3, -1
_STALL_MS = 1000
_RECEIVER_QUEUE = 10_000
_OPEN_TIMEOUT_MS = 30_000
_ERROR_BYTES = 1024
_NO_TIME = 2**63 - 1
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_READER_KEYS = {"receiverqueuesize", "readername", "subscriptionroleprefix", "subscriptionname"}
"""``pulsar.reader.*`` settings the native reader honours (the rest need the client's)."""


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Batch(ctypes.Structure):
    """``Batch`` of ``native/spark_reader/src/lib.rs``, field for field."""

    _fields_ = [
        ("rows", ctypes.c_uint64),
        ("last_ledger", ctypes.c_int64),
        ("last_entry", ctypes.c_int64),
        ("last_batch", ctypes.c_int64),
        ("value_offsets", _Buffer),
        ("value_data", _Buffer),
        ("key_validity", _Buffer),
        ("key_nulls", ctypes.c_uint64),
        ("key_offsets", _Buffer),
        ("key_data", _Buffer),
        ("id_offsets", _Buffer),
        ("id_data", _Buffer),
        ("publish_us", _Buffer),
        ("event_validity", _Buffer),
        ("event_nulls", ctypes.c_uint64),
        ("event_us", _Buffer),
        ("property_offsets", _Buffer),
        ("property_key_offsets", _Buffer),
        ("property_key_data", _Buffer),
        ("property_value_offsets", _Buffer),
        ("property_value_data", _Buffer),
        ("message", _Buffer),
    ]


_LOCK = threading.Lock()
_LIBRARY: list[Any] = []
"""The loaded library (at most one), once loading was tried."""
_TRIED: list[bool] = []
_SAID: set[str] = set()


def _say_once(text: str, *args: Any) -> None:
    """Log ``text`` the first time this process meets it."""
    with _LOCK:
        if text in _SAID:
            return
        _SAID.add(text)
    log.warning(text, *args)


def _library() -> Any:
    with _LOCK:
        if not _TRIED:
            _TRIED.append(True)
            try:
                library = ctypes.CDLL(str(LIBRARY))
            except OSError as error:
                missing = error
            else:
                _declare(library)
                _LIBRARY.append(library)
                return library
        else:
            return _LIBRARY[0] if _LIBRARY else None
    _say_once(
        "the native Pulsar reader is not available (%s): reading with the Python client; "
        "build it with `make install` (needs Rust's cargo)",
        missing,
    )
    return None


def _declare(library: Any) -> None:
    text = [ctypes.c_char_p, ctypes.c_size_t]
    library.msr_open.argtypes = [
        *text,  # service URL
        *text,  # authentication method
        *text,  # authentication data
        *text,  # topic
        *text,  # subscription
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_uint32,
        ctypes.c_int32,
        ctypes.c_uint64,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    library.msr_open.restype = ctypes.c_void_p
    library.msr_next.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint64,
        ctypes.c_uint64,
        ctypes.POINTER(_Batch),
    ]
    library.msr_next.restype = ctypes.c_int32
    library.msr_close.argtypes = [ctypes.c_void_p]
    library.msr_close.restype = None


def native_available() -> bool:
    """Whether the native reader was built and loads (saying once if not)."""
    return _library() is not None


def _token(client_conf: Mapping[str, str]) -> str | None:
    """The token of ``AuthenticationToken`` settings, "" without authentication, None for
    another kind (which needs the Python client)."""
    plugin = client_conf.get("authPluginClassName", "")
    if not plugin:
        return ""
    if plugin.rsplit(".", 1)[-1] != "AuthenticationToken":
        return None
    params = (client_conf.get("authParams") or client_conf.get("authParamMap", "")).strip()
    if params.startswith("{"):
        import json

        params = str(json.loads(params).get("token", ""))
    if params.startswith("file:"):
        return Path(params.removeprefix("file:").removeprefix("//")).read_text().strip()
    return params.removeprefix("token:")


def native_refusal(settings: ReadSettings) -> str | None:
    """Why ``settings`` need the Python client (None: the native reader can read)."""
    if not settings.service_url.startswith("pulsar://"):
        return f"service URL {settings.service_url.split('://')[0]}:// (TLS or HTTP lookup)"
    if _token(settings.client_conf) is None:
        return f"authentication {settings.client_conf.get('authPluginClassName')}"
    others = sorted(k for k in settings.reader_conf if k.lower() not in _READER_KEYS)
    if others:
        return f"pulsar.reader.{others[0]}"
    return None


def _partition_index(topic: str) -> int:
    """The partition index the Python client writes into the ids of ``topic``'s messages."""
    base, _, index = topic.rpartition("-partition-")
    return int(index) if base and index.isdigit() else -1


class _NativeReader:
    """One native reader of a range, from a position on."""

    def __init__(
        self,
        library: Any,
        part: RangePartition,
        end: Position,
        after: Position,
        settings: ReadSettings,
    ) -> None:
        self._library = library
        token = _token(settings.client_conf) or ""
        queue = settings.reader_conf.get("receiverQueueSize")
        prefix = (
            settings.subscription_prefix
            or settings.reader_conf.get("subscriptionRolePrefix")
            or settings.reader_conf.get("subscriptionName")
            or "magnetar-spark"
        )
        texts = [
            settings.service_url.encode(),
            b"token" if token else b"",
            token.encode(),
            part.topic.encode(),
            f"{prefix}-{uuid.uuid4().hex}".encode(),
        ]
        arguments: list[Any] = []
        for text in texts:
            arguments += [text, len(text)]
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        until = _NO_TIME if part.ending_time is None else part.ending_time
        handle = library.msr_open(
            *arguments,
            (ctypes.c_int64 * 3)(*after),
            (ctypes.c_int64 * 3)(*end),
            part.starting_time or 0,
            until,
            int(queue) if queue else _RECEIVER_QUEUE,
            _partition_index(part.topic),
            _OPEN_TIMEOUT_MS,
            error,
            _ERROR_BYTES,
        )
        if not handle:
            raise PulsarReadError(
                f"cannot open a reader on {part.topic}: {error.value.decode(errors='replace')}"
            )
        self._handle = handle
        self.batch = _Batch()

    def next(self, max_rows: int, stall_ms: int) -> int:
        """Reads the next batch into :attr:`batch`; returns its status."""
        status: int = self._library.msr_next(
            self._handle, max_rows, stall_ms, ctypes.byref(self.batch)
        )
        return status

    @property
    def last(self) -> Position:
        batch = self.batch
        return (batch.last_ledger, batch.last_entry, batch.last_batch)

    @property
    def message(self) -> str:
        return _bytes(self.batch.message).decode(errors="replace")

    def close(self) -> None:
        if self._handle:
            self._library.msr_close(self._handle)
            self._handle = None


def native_batches(
    client: pulsar.Client,
    part: RangePartition,
    settings: ReadSettings,
    decoder: ValueDecoder,
    chunk_rows: int = 8192,
) -> Iterator[pa.RecordBatch]:
    """The range ``part`` as record batches, read natively (see the module's docstring for
    what goes to the Python path instead); the rules and errors of :func:`read_range`."""
    library = _library()
    refusal = None if library is None else native_refusal(settings)
    if library is None or refusal is not None:
        if refusal is not None:
            _say_once("reading with the Python client: the native reader cannot read %s", refusal)
        yield from record_batches(read_range(client, part, settings), part.topic, decoder)
        return
    end = resolved_end(client, part)
    if end <= part.start:
        return
    schema = arrow_schema(decoder)
    stall_ms = min(settings.poll_timeout_ms, _STALL_MS)
    waited_ms = 0
    last = part.start
    reader = _NativeReader(library, part, end, last, settings)
    try:
        while True:
            status = reader.next(chunk_rows, stall_ms)
            if reader.last != last:
                last, waited_ms = reader.last, 0
            if reader.batch.rows:
                yield _record_batch(reader.batch, part.topic, decoder, schema)
            if status == _DONE:
                return
            if status == _BATCH:
                continue
            if status == _UNSUPPORTED:
                _say_once(
                    "reading on with the Python client: the native reader does not support %s",
                    reader.message,
                )
                rest = replace(part, start=last, end=end)
                yield from record_batches(read_range(client, rest, settings), part.topic, decoder)
                return
            # Stalled, or the connection failed: a fresh reader from the last message read
            # (as the Python path does), until pollTimeoutMs passes without progress.
            failure = reader.message if status == _FAILED else None
            waited_ms += stall_ms
            if waited_ms >= settings.poll_timeout_ms:
                if failure is not None:
                    raise PulsarReadError(f"cannot read {part.topic}: {failure}")
                lost(part, end, last, settings)
                return
            reader.close()
            reader = _NativeReader(library, part, end, last, settings)
    finally:
        reader.close()


def _bytes(buffer: _Buffer) -> bytes:
    return ctypes.string_at(buffer.data, buffer.len) if buffer.len else b""


def _arrow(buffer: _Buffer) -> pa.Buffer:
    """A copy of a buffer the native reader lends until its next call."""
    return pa.py_buffer(_bytes(buffer))


def _binary(
    rows: int, offsets: _Buffer, data: _Buffer, validity: _Buffer | None = None, nulls: int = 0
) -> pa.Array:
    mask = _arrow(validity) if validity is not None and nulls else None
    return pa.Array.from_buffers(
        pa.binary(), rows, [mask, _arrow(offsets), _arrow(data)], null_count=nulls
    )


def _record_batch(
    batch: _Batch, topic: str, decoder: ValueDecoder, schema: pa.Schema
) -> pa.RecordBatch:
    rows = batch.rows
    ids = _binary(rows, batch.id_offsets, batch.id_data)

    def describe(index: int) -> str:
        return f"message {describe_id(ids[index].as_py())} of {topic}"

    event_mask = _arrow(batch.event_validity) if batch.event_nulls else None
    property_keys = batch.property_key_offsets.len // 4 - 1
    properties = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), rows + 1, [None, _arrow(batch.property_offsets)]),
        _binary(property_keys, batch.property_key_offsets, batch.property_key_data).cast(
            pa.string()
        ),
        _binary(property_keys, batch.property_value_offsets, batch.property_value_data).cast(
            pa.string()
        ),
    )
    columns = [
        *decoder.decode(_binary(rows, batch.value_offsets, batch.value_data), describe),
        _binary(rows, batch.key_offsets, batch.key_data, batch.key_validity, batch.key_nulls),
        pa.repeat(pa.scalar(topic, pa.string()), rows),
        ids,
        pa.Array.from_buffers(_TIMESTAMP, rows, [None, _arrow(batch.publish_us)]),
        pa.Array.from_buffers(
            _TIMESTAMP, rows, [event_mask, _arrow(batch.event_us)], null_count=batch.event_nulls
        ),
        properties,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
