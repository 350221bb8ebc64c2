"""Is a Pulsar broker there? A fast check before a client library would retry for long.

A firewall or proxy may accept any TCP connection, so for ``pulsar://`` the check also sends
a Pulsar CONNECT and wants a well-formed frame back (any frame: an authentication error
still means a broker is there, and the real client reports it better).
"""

from __future__ import annotations

import socket
import struct
from urllib.parse import urlsplit

from magnetar.broker import BrokerError

__all__ = [
    "ASKS_FOR_AUTHENTICATION",
    "broker_addresses",
    "broker_version",
    "check_broker",
    "protobuf_fields",
    "server_version",
]

_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443}

ASKS_FOR_AUTHENTICATION = "(a broker that asks for authentication)"
"""What :func:`broker_version` reports for a broker that refuses a CONNECT without
credentials: it names no version then, but it is no pulsar-lite, which has no
authentication."""

_CONNECTED = 3
_ERROR = 14
_AUTHENTICATION_ERROR = 3


def broker_addresses(broker_url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a service URL such as ``pulsar://a:6650,b:6650/``.

    Raises ``ValueError`` for a URL that is not ``pulsar://``, ``pulsar+ssl://``,
    ``http://`` or ``https://`` with at least one host.
    """
    scheme, sep, rest = broker_url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise ValueError(
            f"{broker_url!r} is not a Pulsar service URL; expected e.g. pulsar://localhost:6650"
        )
    authority = rest.split("/", 1)[0]
    addresses: list[tuple[str, int]] = []
    # Pulsar accepts several hosts in one URL; urlsplit understands only one at a time.
    for host_port in authority.split(","):
        try:
            parts = urlsplit(f"{scheme}://{host_port}")
            host, port = parts.hostname, parts.port
        except ValueError as error:
            raise ValueError(f"invalid host in {broker_url!r}: {error}") from None
        if not host:
            raise ValueError(f"no host in {broker_url!r}; expected e.g. pulsar://localhost:6650")
        addresses.append((host, port if port is not None else _DEFAULT_PORTS[scheme]))
    return addresses


def check_broker(broker_url: str, timeout: float = 5.0) -> None:
    """Return once some host of ``broker_url`` answers; ``BrokerError`` naming the URL and
    each host's failure otherwise (``ValueError`` for a malformed URL)."""
    handshake = broker_url.lower().startswith("pulsar://")
    failures: list[str] = []
    for host, port in broker_addresses(broker_url):
        reason = _check_host(host, port, timeout, handshake)
        if reason is None:
            return
        failures.append(f"{host}:{port}: {reason}")
    raise BrokerError(
        f"cannot reach the Pulsar broker at {broker_url} ({'; '.join(failures)}); "
        "is it running? Check --broker-url or MAGNETAR_BROKER_URL"
    )


def server_version(broker_url: str, timeout: float = 2.0) -> str | None:
    """What the broker at a ``pulsar://`` URL calls itself when it accepts a connection
    (``Pulsar Server4.0.7``, ``Pulsar-Lite-0.1.0``), ``ASKS_FOR_AUTHENTICATION`` when it asks
    for credentials first; None when no host says (another scheme, not reachable)."""
    try:
        return broker_version(broker_url, timeout)
    except BrokerError:
        return None


def _connect_frame() -> bytes:
    """A Pulsar CONNECT command, protobuf written by hand to need no generated code."""
    version = b"magnetar-probe"
    # CommandConnect: client_version (field 1), protocol_version = 21 (field 4).
    connect = b"\x0a" + bytes([len(version)]) + version + b"\x20\x15"
    # BaseCommand: type = CONNECT (field 1 = 2), connect (field 2).
    command = b"\x08\x02\x12" + bytes([len(connect)]) + connect
    return struct.pack(">II", len(command) + 4, len(command)) + command


_CONNECT_FRAME = _connect_frame()
_MAX_FRAME = 5 * 1024 * 1024 + 10 * 1024
"""Pulsar's default maximum message size plus headroom; larger means not Pulsar."""


def _check_host(host: str, port: int, timeout: float, handshake: bool) -> str | None:
    """None when ``host:port`` accepts TCP (and answers as Pulsar if asked), else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if not handshake:
                return None
            sock.sendall(_CONNECT_FRAME)
            header = _recv_exactly(sock, 8)
            rest = _frame_size(header)
            if rest is not None:
                # Read the frame to its end: closing with bytes unread resets the connection,
                # which the embedded broker's healer would take for a client that died.
                _recv_exactly(sock, rest)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    if not header:
        return "closed the connection without answering as a Pulsar broker"
    # Any well-formed frame will do: an ERROR (e.g. authentication required) still means
    # a broker is there, and the real client reports it better.
    if _frame_size(header) is None:
        return "answered, but not as a Pulsar broker"
    return None


def _frame_size(header: bytes) -> int | None:
    """The bytes of the frame after its 8-byte ``header``; None if it is not a Pulsar frame."""
    if len(header) < 8:
        return None
    total, size = struct.unpack(">II", header)
    if not 0 < size < total <= _MAX_FRAME:
        return None
    return int(total) - 4


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes; fewer only when the peer closed the connection."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def broker_version(broker_url: str, timeout: float = 5.0) -> str | None:
    """The ``server_version`` a ``pulsar://`` broker reports in its CONNECTED answer (e.g.
    ``Pulsar-Lite-0.1.0``); ``ASKS_FOR_AUTHENTICATION`` when it refuses to connect without
    credentials; None when it cannot be asked without the client (TLS) or answers otherwise.
    ``BrokerError`` when no host of the URL answers."""
    if not broker_url.lower().startswith("pulsar://"):
        return None
    failures: list[str] = []
    for host, port in broker_addresses(broker_url):
        try:
            with socket.create_connection((host, port), timeout=timeout) as sock:
                sock.sendall(_CONNECT_FRAME)
                header = _recv_exactly(sock, 8)
                if len(header) < 8:
                    return None
                total, _size = struct.unpack(">II", header)
                if not 4 < total <= _MAX_FRAME:
                    return None
                return _server_version(_recv_exactly(sock, total - 4))
        except TimeoutError:
            failures.append(f"{host}:{port}: no answer within {timeout:g} s")
        except OSError as error:
            failures.append(f"{host}:{port}: {error.strerror or error}")
    raise BrokerError(
        f"cannot reach the Pulsar broker at {broker_url} ({'; '.join(failures)}); is it running?"
    )


def _server_version(command: bytes) -> str | None:
    """``connected.server_version`` of a BaseCommand (type CONNECTED = 3, field 3), or
    ``ASKS_FOR_AUTHENTICATION`` for an ERROR (14, field 14) whose error is
    AuthenticationError."""
    fields = dict(protobuf_fields(command))
    error = fields.get(14)
    if fields.get(1) == _ERROR and isinstance(error, bytes):
        refused = dict(protobuf_fields(error)).get(2) == _AUTHENTICATION_ERROR
        return ASKS_FOR_AUTHENTICATION if refused else None
    connected = fields.get(3)
    if fields.get(1) != _CONNECTED or not isinstance(connected, bytes):
        return None
    version = dict(protobuf_fields(connected)).get(1)
    return version.decode(errors="replace") if isinstance(version, bytes) else None


def protobuf_fields(message: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message: varints and byte strings, up to
    the first fixed-width field (none in the Pulsar commands and ids read here)."""
    found: list[tuple[int, int | bytes]] = []
    index = 0
    while index < len(message):
        key, index = _varint(message, index)
        wire_type = key & 7
        if wire_type == 0:
            value, index = _varint(message, index)
            found.append((key >> 3, value))
        elif wire_type == 2:
            length, index = _varint(message, index)
            found.append((key >> 3, message[index : index + length]))
            index += length
        else:
            break  # fixed-width fields: none in what is read here
    return found


def _varint(data: bytes, index: int) -> tuple[int, int]:
    value = shift = 0
    while index < len(data):
        byte = data[index]
        index += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return value, index
