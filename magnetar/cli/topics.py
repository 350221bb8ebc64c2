"""`magnetar topics produce|consume`: send and read messages, like ``pulsar-client``.

Also home of :func:`connect`, the one way CLI commands build a Pulsar client: it checks
that a broker answers first (``magnetar.broker_probe``), so a wrong URL fails fast with a
message naming it instead of the client library retrying for its whole operation timeout.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import click
import pulsar

from magnetar.broker import BrokerError
from magnetar.broker_probe import check_broker
from magnetar.topics import full_topic_name

if TYPE_CHECKING:
    from magnetar.cli.context import CliContext

__all__ = ["connect", "topics"]

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
    try:
        check_broker(broker_url, connect_timeout)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--broker-url") from None
    except BrokerError as error:
        raise click.ClickException(str(error)) from None
    try:
        return pulsar.Client(
            broker_url,
            operation_timeout_seconds=operation_timeout_seconds,
            connection_timeout_ms=int(connect_timeout * 1000),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
    except pulsar.PulsarException as error:
        raise click.ClickException(f"cannot connect to {broker_url}: {error}") from error


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
    """Send messages to TOPIC and wait until the broker has stored every one.

    \b
    Example:
      magnetar --broker-url pulsar://localhost:6650 topics produce in -m hello -n 10 --key k
    """
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

    \b
    Example:
      magnetar --broker-url pulsar://localhost:6650 topics consume out -n 10 \\
          --subscription-position Earliest
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
