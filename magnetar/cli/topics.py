"""`magnetar topics produce|consume`: send and read messages, like ``pulsar-client``.

Also home of :func:`connect`, the one way CLI commands build a Pulsar client: it checks
that a broker answers first (TCP, plus a Pulsar handshake for ``pulsar://``), so a wrong
URL fails fast with a message naming it instead of the client library retrying for its
whole operation timeout.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click
import pulsar

from magnetar.topics import full_topic_name

if TYPE_CHECKING:
    from magnetar.cli.app import CliContext

__all__ = ["broker_addresses", "connect", "topics"]

_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443}

_SUBSCRIPTION_TYPES = {
    "Exclusive": pulsar.ConsumerType.Exclusive,
    "Shared": pulsar.ConsumerType.Shared,
    "Failover": pulsar.ConsumerType.Failover,
    "Key_Shared": pulsar.ConsumerType.KeyShared,
}

_POSITIONS = {
    "Latest": pulsar.InitialPosition.Latest,
    "Earliest": pulsar.InitialPosition.Earliest,
}

_POLL_MILLIS = 200
"""How long one ``receive`` blocks, so Ctrl-C and ``--timeout`` are noticed promptly."""

_EXIT_INTERRUPTED = 130
"""What shells report for a command stopped by SIGINT (128 + 2)."""


def broker_addresses(broker_url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a service URL such as ``pulsar://a:6650,b:6650/``.

    Raises ``click.BadParameter`` for a URL that is not ``pulsar://``, ``pulsar+ssl://``,
    ``http://`` or ``https://`` with at least one host.
    """
    scheme, sep, rest = broker_url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise click.BadParameter(
            f"{broker_url!r} is not a Pulsar service URL; expected e.g. pulsar://localhost:6650",
            param_hint="--broker-url",
        )
    authority = rest.split("/", 1)[0]
    addresses: list[tuple[str, int]] = []
    # Pulsar accepts several hosts in one URL; urlsplit understands only one at a time.
    for host_port in authority.split(","):
        try:
            parts = urlsplit(f"{scheme}://{host_port}")
            host, port = parts.hostname, parts.port
        except ValueError as error:
            raise click.BadParameter(
                f"invalid host in {broker_url!r}: {error}", param_hint="--broker-url"
            ) from error
        if not host:
            raise click.BadParameter(
                f"no host in {broker_url!r}; expected e.g. pulsar://localhost:6650",
                param_hint="--broker-url",
            )
        addresses.append((host, port if port is not None else _DEFAULT_PORTS[scheme]))
    return addresses


def connect(
    broker_url: str,
    *,
    connect_timeout: float = 5.0,
    operation_timeout_seconds: int = 10,
) -> pulsar.Client:
    """A ``pulsar.Client`` for ``broker_url``, once some broker host answers.

    Each host must accept TCP within ``connect_timeout`` seconds; for ``pulsar://`` it
    must also answer a Pulsar CONNECT, since a firewall or proxy may accept any TCP
    connection and the client library would then retry for far longer than its operation
    timeout. Raises ``click.ClickException`` naming the URL when no host passes, and
    ``click.BadParameter`` for a malformed URL. The client logs errors only.
    """
    handshake = broker_url.lower().startswith("pulsar://")
    failures: list[str] = []
    for host, port in broker_addresses(broker_url):
        reason = _check_broker(host, port, connect_timeout, handshake)
        if reason is None:
            break
        failures.append(f"{host}:{port}: {reason}")
    else:
        raise click.ClickException(
            f"cannot reach the Pulsar broker at {broker_url} ({'; '.join(failures)}); "
            "is it running? Check --broker-url or MAGNETAR_BROKER_URL"
        )
    try:
        return pulsar.Client(
            broker_url,
            operation_timeout_seconds=operation_timeout_seconds,
            connection_timeout_ms=int(connect_timeout * 1000),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
    except pulsar.PulsarException as error:
        raise click.ClickException(f"cannot connect to {broker_url}: {error}") from error


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


def _check_broker(host: str, port: int, timeout: float, handshake: bool) -> str | None:
    """None when ``host:port`` accepts TCP (and answers as Pulsar if asked), else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if not handshake:
                return None
            sock.sendall(_CONNECT_FRAME)
            header = _recv_exactly(sock, 8)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    if not header:
        return "closed the connection without answering as a Pulsar broker"
    if len(header) < 8:
        return "answered, but not as a Pulsar broker"
    total, size = struct.unpack(">II", header)
    # Any well-formed frame will do: an ERROR (e.g. authentication required) still means
    # a broker is there, and the real client reports it better.
    if not 0 < size < total <= _MAX_FRAME:
        return "answered, but not as a Pulsar broker"
    return None


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes; fewer only when the peer closed the connection."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _broker_url(obj: CliContext) -> str:
    if not obj.broker_url:
        raise click.UsageError(
            "no Pulsar broker given: pass --broker-url (e.g. pulsar://localhost:6650) "
            "or set MAGNETAR_BROKER_URL"
        )
    return obj.broker_url


def _topic_name(topic: str) -> str:
    try:
        return full_topic_name(topic)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="TOPIC") from error


def _parse_properties(values: Sequence[str]) -> dict[str, str]:
    properties: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{item!r} is not KEY=VALUE", param_hint="'-p' / '--properties'"
            )
        properties[key] = value
    return properties


def _close(*resources: Any) -> None:
    """Close consumers, producers and clients, ignoring errors: we are leaving anyway."""
    for resource in resources:
        if resource is None:
            continue
        with suppress(pulsar.PulsarException):
            resource.close()


@contextmanager
def _exit_on_interrupt(ctx: click.Context) -> Iterator[None]:
    """Turn Ctrl-C into exit code 130 without click's "Aborted!" or a traceback.

    The pulsar library raises ``pulsar.Interrupted`` when SIGINT lands inside one of its
    blocking calls, Python raises ``KeyboardInterrupt`` everywhere else.
    """
    try:
        yield
    except (KeyboardInterrupt, pulsar.Interrupted):
        click.echo("", err=True)  # end the ^C line
        ctx.exit(_EXIT_INTERRUPTED)


@click.group()
def topics() -> None:
    """Produce messages to and consume messages from Pulsar topics."""


@topics.command()
@click.argument("topic")
@click.option(
    "-m",
    "--messages",
    "messages",
    multiple=True,
    required=True,
    metavar="MSG",
    help="A message to send (UTF-8); repeat for several.",
)
@click.option(
    "-n",
    "--num-produce",
    "count",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Send the messages this many times.",
)
@click.option("-k", "--key", default=None, help="Partition key for every message.")
@click.option(
    "-p",
    "--properties",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    help="A message property; repeat for several.",
)
@click.pass_context
def produce(
    ctx: click.Context,
    *,
    topic: str,
    messages: tuple[str, ...],
    count: int,
    key: str | None,
    properties: tuple[str, ...],
) -> None:
    """Send messages to TOPIC and wait until the broker has stored every one."""
    obj: CliContext = ctx.obj
    broker_url = _broker_url(obj)
    full_name = _topic_name(topic)
    props = _parse_properties(properties)
    total = len(messages) * count

    # Callbacks run on the client's I/O thread; the condition lets us wait for all of them,
    # since flush() returning does not promise that every callback has already run.
    done = threading.Condition()
    results: list[Any] = []

    def on_sent(result: Any, _msg_id: Any) -> None:
        with done:
            results.append(result)
            done.notify_all()

    with _exit_on_interrupt(ctx):
        client = connect(broker_url)
        producer = None
        try:
            try:
                producer = client.create_producer(
                    full_name,
                    batching_enabled=True,
                    batching_max_publish_delay_ms=10,
                    block_if_queue_full=True,  # a large -n waits for room, not fails
                )
            except pulsar.PulsarException as error:
                raise click.ClickException(
                    f"cannot create a producer on {full_name} at {broker_url}: {error}"
                ) from error
            try:
                for _ in range(count):
                    for message in messages:
                        producer.send_async(
                            message.encode("utf-8"),
                            on_sent,
                            properties=props or None,
                            partition_key=key,
                        )
                producer.flush()
            except pulsar.PulsarException as error:
                raise click.ClickException(
                    f"sending to {full_name} failed after {len(results)} of {total} "
                    f"messages: {error}"
                ) from error
            with done:
                # Sends time out after 30 s on their own; the margin is for the callbacks.
                done.wait_for(lambda: len(results) == total, timeout=40)
                failures = [r for r in results if r != pulsar.Result.Ok]
                missing = total - len(results)
        finally:
            _close(producer, client)

    if failures or missing:
        # pulsar.Result prints as "Result.Timeout"; the bare name reads better.
        first = getattr(failures[0], "name", failures[0]) if failures else "no reply in time"
        raise click.ClickException(
            f"{len(failures) + missing} of {total} messages were not produced to "
            f"{full_name}: {first}"
        )
    if obj.output == "json":
        click.echo(json.dumps({"topic": full_name, "produced": total}, separators=(",", ":")))
    else:
        noun = "message" if total == 1 else "messages"
        click.echo(f"{total} {noun} produced to {full_name}")


@topics.command()
@click.argument("topic")
@click.option(
    "-s",
    "--subscription-name",
    "subscription",
    default="magnetar-cli",
    show_default=True,
    help="Subscription to read through.",
)
@click.option(
    "-n",
    "--num-messages",
    "count",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Stop after this many messages; 0 reads until Ctrl-C.",
)
@click.option(
    "-t",
    "--subscription-type",
    type=click.Choice(list(_SUBSCRIPTION_TYPES), case_sensitive=False),
    default="Exclusive",
    show_default=True,
)
@click.option(
    "--subscription-position",
    type=click.Choice(list(_POSITIONS), case_sensitive=False),
    default="Latest",
    show_default=True,
    help="Where a new subscription starts; an existing one keeps its position.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Fail if no message arrives within SECONDS (after subscribing or the last message).",
)
@click.pass_context
def consume(
    ctx: click.Context,
    *,
    topic: str,
    subscription: str,
    count: int,
    subscription_type: str,
    subscription_position: str,
    timeout: float | None,
) -> None:
    """Print and acknowledge messages from TOPIC.

    One line per message: the payload as text, after the key in brackets if there is one;
    with --output json, one JSON object per line.
    """
    obj: CliContext = ctx.obj
    broker_url = _broker_url(obj)
    full_name = _topic_name(topic)

    with _exit_on_interrupt(ctx):
        client = connect(broker_url)
        consumer = None
        try:
            try:
                consumer = client.subscribe(
                    full_name,
                    subscription,
                    consumer_type=_SUBSCRIPTION_TYPES[subscription_type],
                    initial_position=_POSITIONS[subscription_position],
                )
            except pulsar.PulsarException as error:
                raise click.ClickException(
                    f"cannot subscribe to {full_name} as {subscription!r} at {broker_url}: {error}"
                ) from error
            received = 0
            while count == 0 or received < count:
                msg = _receive(consumer, full_name, timeout)
                _print_message(msg, obj.output)
                consumer.acknowledge(msg)
                received += 1
        finally:
            _close(consumer, client)


def _receive(consumer: Any, topic: str, timeout: float | None) -> Any:
    """The next message, polling in short slices so Ctrl-C is never stuck in C++."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = _POLL_MILLIS
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise click.ClickException(f"no message within {timeout:g} s on {topic}")
            wait = max(1, min(wait, int(left * 1000)))
        try:
            return consumer.receive(timeout_millis=wait)
        except pulsar.Timeout:
            continue
        except pulsar.Interrupted:
            raise
        except pulsar.PulsarException as error:
            raise click.ClickException(f"receiving from {topic} failed: {error}") from error


def _print_message(msg: Any, output: str) -> None:
    value = msg.data().decode("utf-8", errors="replace")
    key = msg.partition_key() or None  # the library reports "no key" as ""
    if output == "json":
        record = {
            "messageId": str(msg.message_id()),
            "key": key,
            "properties": msg.properties(),
            "value": value,
            "publishTimestamp": msg.publish_timestamp(),
            "eventTimestamp": msg.event_timestamp(),
        }
        click.echo(json.dumps(record, separators=(",", ":")))
    elif key is None:
        click.echo(value)
    else:
        click.echo(f"[{key}] {value}")
