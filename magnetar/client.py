"""Pulsar clients for workers and instances, with a workaround for the embedded broker.

pulsar-lite 0.2 tells the consumers of a subscription apart by the consumer id the *client*
chose. Every client numbers its consumers from 0, so two processes joining one subscription
(instances of one function, workers electing a leader) collide: the second subscribe is
refused and times out. Each client therefore first uses up a random number of consumer ids
on a private topic, and a subscribe that times out is tried again, which takes the next id.
The topic is non-persistent: pulsar-lite never removes a closed reader's subscription, and on
a persistent topic every one of them is a stored cursor that makes the next subscribe slower
(from 1.5 ms to 20 ms a reader after a few thousand); on a non-persistent topic a reader
costs half a millisecond and leaves nothing behind. Apache Pulsar tells consumers apart per
connection, so there the client asks the broker its name first (one handshake) and spreads
nothing: the readers would cost some 0.3 s a client there. A broker that asks for credentials
before it says its name is no pulsar-lite (which has no authentication) either. The colliding
subscribe is tried again only once it times out, so on pulsar-lite operations time out after
3 s; elsewhere after the client's default of 30 s, as Apache Pulsar's own instances wait: a
broker that pauses longer than 3 s (a long garbage collection, a slow first ledger of a new
topic) would otherwise fail an instance's lookup or producer and restart it.

Readers are opened with ``open_reader``, never ``client.create_reader``: the client library
names a reader's subscription with a random generator it seeds once, when it is loaded, so
every process forked after ``import pulsar`` (each instance, from the workers' fork server)
draws the same names in the same order. On pulsar-lite two readers of one topic with one
name share a subscription, and a new reader with a name used before resumes where that one
stopped: an instance's state table then silently missed journal messages another
instance's reader had read (a timer armed before a rescale never fired).

A control-plane client (``create_client(..., log_to_python=True)``: the worker's own) sends
the client library's log into Python's logging (logger ``magnetar.pulsar_client``) at
Magnetar's levels: its INFO chatter is DEBUG here, and so is what the embedded broker makes
it report in normal operation (asking an empty topic for its last message id fails); its
DEBUG is kept out unless that logger is set to DEBUG explicitly. The library hands a Python
logger every line, DEBUG included (about nine per message), each taking the GIL from an I/O
thread: measured 17% slower on a produce-and-consume loop, so data-plane clients (instances)
log errors to the console instead. A process whose client logs to Python must end with
``os._exit`` once its clients are closed: the library's threads may still log while the
interpreter finalizes, which aborts the process (apache/pulsar-client-python#256).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pulsar

from magnetar.broker_probe import server_version

__all__ = [
    "Connection",
    "client_logger",
    "create_client",
    "newest_first",
    "open_reader",
    "subscribe",
]

log = logging.getLogger(__name__)

_ID_SPREAD = 128
_LITE_OPERATION_TIMEOUT_S = 3
_OPERATION_TIMEOUT_S = 30
_SPREAD_TOPIC = "non-persistent://public/default/__magnetar_consumer_ids"
_SUBSCRIBE_ATTEMPTS = 4
_NEWEST_FIRST = 10**20
_CLIENT_LOGGER = "magnetar.pulsar_client"
_TOKEN_PLUGINS = ("AuthenticationToken", "token")
_EXPECTED = (
    # pulsar-lite answers a getLastMessageId on an empty topic with an error
    "Failed to getLastMessageId: UnknownError",
    "(Topic has no messages)",
)


@dataclass(frozen=True)
class Connection:
    """How a client authenticates and secures its connection (pulsar-admin's localrun flags
    --client-auth-plugin, --client-auth-params, --use-tls, ...)."""

    auth_plugin: str | None = None
    """An authentication plugin, by Pulsar's Java class name (AuthenticationToken, ...)."""
    auth_params: str | None = field(default=None, repr=False)
    """The plugin's parameters (``token:...``, ``file:...`` or JSON); kept out of the repr,
    which a log line may show."""
    use_tls: bool = False
    tls_allow_insecure: bool = False
    tls_validate_hostname: bool = False
    tls_trust_cert_path: str | None = None

    def bearer_token(self) -> str | None:
        """The token an HTTP call (the broker's admin API) sends as ``Bearer``: the
        AuthenticationToken plugin's, read as Pulsar's client reads its parameters
        (``token:<jwt>``, ``file:///path``, or the token itself); None for other plugins."""
        if not self.auth_plugin or self.auth_plugin.rsplit(".", 1)[-1] not in _TOKEN_PLUGINS:
            return None
        params = (self.auth_params or "").strip()
        if params.startswith("token:"):
            return params.removeprefix("token:").strip()
        if params.startswith("file:"):
            path = urlparse(params).path if params.startswith("file://") else params[5:]
            return Path(path).read_text().strip()
        return params or None

    def client_kwargs(self) -> dict[str, Any]:
        """The ``pulsar.Client`` arguments."""
        kwargs: dict[str, Any] = {}
        if self.auth_plugin:
            kwargs["authentication"] = pulsar.Authentication(
                self.auth_plugin, self.auth_params or ""
            )
        if self.use_tls:
            kwargs["use_tls"] = True
        if self.tls_allow_insecure:
            kwargs["tls_allow_insecure_connection"] = True
        if self.tls_validate_hostname:
            kwargs["tls_validate_hostname"] = True
        if self.tls_trust_cert_path:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_cert_path
        return kwargs


class _ClientLogLevels(logging.Filter):
    """Puts the client library's records at Magnetar's levels (see the module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO and not any(
            expected in record.getMessage() for expected in _EXPECTED
        ):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def client_logger() -> logging.Logger:
    """The logger to give ``pulsar.Client(logger=...)``: the client's log at our levels."""
    logger = logging.getLogger(_CLIENT_LOGGER)
    if not any(isinstance(f, _ClientLogLevels) for f in logger.filters):
        logger.addFilter(_ClientLogLevels())
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return logger


def create_client(
    service_url: str,
    connection: Connection | None = None,
    *,
    log_to_python: bool = False,
) -> pulsar.Client:
    """A client whose consumer ids are unlikely to collide with other clients'; it logs
    through ``client_logger`` with ``log_to_python``, else only errors, to the console."""
    logger = client_logger() if log_to_python else pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    spread = _needs_id_spread(service_url)
    client = pulsar.Client(
        service_url,
        logger=logger,
        operation_timeout_seconds=_LITE_OPERATION_TIMEOUT_S if spread else _OPERATION_TIMEOUT_S,
        **(connection.client_kwargs() if connection else {}),
    )
    if not spread:
        return client
    try:
        for _ in range(random.randrange(_ID_SPREAD)):
            # a plain reader: only its consumer id counts, not its subscription's name
            client.create_reader(_SPREAD_TOPIC, pulsar.MessageId.latest).close()
    except Exception as error:  # only an optimization: subscribe() still retries
        log.debug("spreading consumer ids failed: %s", error)
    return client


def _needs_id_spread(service_url: str) -> bool:
    """Whether the broker may be pulsar-lite (any broker that does not say what it is)."""
    try:
        version = server_version(service_url)
    except ValueError:  # a URL the client itself will refuse, with its own message
        return False
    return version is None or _is_pulsar_lite(version)


def shared_acks_cost_gaps(service_url: str) -> bool:
    """Whether the broker's work for each acknowledgement and dispatch on a shared
    subscription grows with the gaps between the messages acknowledged so far: pulsar-lite
    0.2 reads and rewrites the subscription's whole cursor every time, Apache Pulsar keeps it
    in memory."""
    try:
        version = server_version(service_url)
    except ValueError:
        return False
    return version is not None and _is_pulsar_lite(version)


def _is_pulsar_lite(version: str) -> bool:
    return "lite" in version.lower()


def subscribe(client: pulsar.Client, topic: Any, subscription: str, **kwargs: Any) -> Any:
    """``client.subscribe`` that tries again when the broker refuses a colliding consumer id."""
    for _ in range(_SUBSCRIBE_ATTEMPTS - 1):
        try:
            return client.subscribe(topic, subscription, **kwargs)
        except pulsar.Timeout:
            log.info(
                "subscribing to %s as %r timed out; trying again with a new consumer id",
                topic,
                subscription,
            )
    return client.subscribe(topic, subscription, **kwargs)


def open_reader(client: pulsar.Client, topic: str, start_message_id: Any, **kwargs: Any) -> Any:
    """``client.create_reader`` on a subscription no other reader has (see the module doc):
    its name starts with random bytes of the operating system's, which a fork does not
    copy."""
    return client.create_reader(
        topic,
        start_message_id,
        subscription_role_prefix=f"magnetar-{uuid.uuid4().hex[:16]}",
        **kwargs,
    )


_latest_ns = [0]


def newest_first() -> str:
    """A consumer-name part that sorts before every one made earlier: pulsar-lite makes the
    Failover consumer whose name sorts first the active one."""
    now = _latest_ns[0] = max(time.time_ns(), _latest_ns[0] + 1)  # one tick, two names
    return f"{_NEWEST_FIRST - now:020d}"
