"""Pulsar clients for the driver and the executors, and what the driver asks the broker.

Options cross to executors as plain strings (an ``Authentication`` object cannot be
pickled), so every process builds its own client from them here.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulsar

from magnetar.broker import BrokerError
from magnetar.broker_probe import check_broker
from magnetar.spark_connector._offsets import BEFORE_EARLIEST, Position, end_position
from magnetar.spark_connector._passthrough import client_kwargs
from magnetar.spark_connector.exceptions import InvalidOptionError, PulsarReadError

__all__ = ["last_position", "open_client", "shared_client", "topic_partitions"]

_REACH_TIMEOUT_S = 5.0
_EMPTY_PROBE_MS = 200
"""How long a topic must stay silent from its earliest message to count as empty."""


class _HandledErrors(logging.Filter):
    """Drops the client's log lines about errors the connector expects and handles:
    pulsar-lite answers "last message of an empty topic" with an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to getLastMessageId" not in record.getMessage()


_CLIENT_LOG = logging.getLogger("magnetar.spark_connector.pulsar_client")
_CLIENT_LOG.addFilter(_HandledErrors())
if _CLIENT_LOG.level == logging.NOTSET:
    _CLIENT_LOG.setLevel(logging.ERROR)


def open_client(service_url: str, client_conf: Mapping[str, str]) -> pulsar.Client:
    """A client for ``service_url`` configured by checked ``pulsar.client.*`` options (Java
    names, see :mod:`._passthrough`)."""
    kwargs: dict[str, Any] = {"logger": _CLIENT_LOG}
    kwargs.update(client_kwargs(client_conf))
    plugin = client_conf.get("authPluginClassName")
    params = client_conf.get("authParams") or client_conf.get("authParamMap", "")
    if plugin:
        kwargs["authentication"] = _authentication(plugin, params)
    elif params:
        raise InvalidOptionError(
            "pulsar.client.authParams is set but pulsar.client.authPluginClassName is not"
        )
    try:
        return pulsar.Client(service_url, **kwargs)
    except pulsar.PulsarException as error:
        raise InvalidOptionError(
            f"cannot create a Pulsar client for {service_url}: {error}"
        ) from None


_SHARED: dict[tuple[str, tuple[tuple[str, str], ...]], pulsar.Client] = {}
_SHARED_LOCK = threading.Lock()


def shared_client(service_url: str, client_conf: Mapping[str, str]) -> pulsar.Client:
    """One client per service URL and settings in this process, kept for its later tasks:
    Spark reuses its Python workers, and connecting costs more than most small reads."""
    key = (service_url, tuple(sorted(client_conf.items())))
    with _SHARED_LOCK:
        client = _SHARED.get(key)
        if client is None:
            _check_reachable(service_url)
            client = _SHARED[key] = open_client(service_url, client_conf)
        return client


def _check_reachable(service_url: str) -> None:
    """Fail at once, naming the URL, where the client would retry for its operation
    timeout (30 s) before failing with "TimeOut"."""
    try:
        check_broker(service_url, _REACH_TIMEOUT_S)
    except BrokerError as error:
        raise PulsarReadError(str(error)) from None
    except ValueError as error:
        raise InvalidOptionError(f"service.url: {error}") from None


def _authentication(plugin: str, params: str) -> Any:
    """The Python counterpart of a Java ``authPluginClassName``, or a C++ plugin library."""
    name = plugin.rsplit(".", 1)[-1]
    if params.strip().startswith("{") and name != "AuthenticationOAuth2":
        params = _from_map(name, params)
    if name == "AuthenticationToken":
        if params.startswith("file:"):
            return pulsar.AuthenticationToken(
                Path(params.removeprefix("file:").removeprefix("//")).read_text().strip()
            )
        return pulsar.AuthenticationToken(params.removeprefix("token:"))
    if name == "AuthenticationTls":
        fields = dict(item.split(":", 1) for item in params.split(",") if ":" in item)
        if "tlsCertFile" not in fields or "tlsKeyFile" not in fields:
            raise InvalidOptionError(
                "pulsar.client.authParams for AuthenticationTls must be "
                "'tlsCertFile:<path>,tlsKeyFile:<path>'"
            )
        return pulsar.AuthenticationTLS(fields["tlsCertFile"], fields["tlsKeyFile"])
    if name == "AuthenticationOAuth2":
        return pulsar.AuthenticationOauth2(params)
    if name == "AuthenticationBasic":
        return pulsar.AuthenticationBasic(auth_params_string=params)
    if plugin.endswith((".so", ".dylib")):
        return pulsar.Authentication(plugin, params)
    raise InvalidOptionError(
        f"pulsar.client.authPluginClassName {plugin!r} is not supported; use one of "
        "...AuthenticationToken, ...AuthenticationTls, ...AuthenticationOAuth2, "
        "...AuthenticationBasic, or the path of a C++ client auth plugin library"
    )


def _from_map(name: str, params: str) -> str:
    """``authParams`` given as a JSON map (``authParamMap``), in the string form."""
    try:
        fields = json.loads(params)
    except json.JSONDecodeError:
        raise InvalidOptionError(f"authParams for {name} is not valid JSON: {params!r}") from None
    if name == "AuthenticationToken":
        return str(fields.get("token", ""))
    if name == "AuthenticationTls":
        return ",".join(f"{key}:{value}" for key, value in fields.items())
    return params


def topic_partitions(client: pulsar.Client, topic: str) -> list[str]:
    """The partitions of ``topic`` (itself when it is not partitioned)."""
    try:
        return list(client.get_topic_partitions(topic))
    except pulsar.PulsarException as error:
        raise PulsarReadError(f"cannot look up the partitions of {topic}: {error}") from None


def last_position(client: pulsar.Client, topic: str) -> Position:
    """The end position of the last message in ``topic`` (BEFORE_EARLIEST when empty).

    Asked through a consumer that prefetches nothing (readers cannot ask), on a throwaway
    subscription removed afterwards.
    """
    try:
        consumer = client.subscribe(
            topic, f"magnetar-spark-{uuid.uuid4().hex[:12]}", receiver_queue_size=0
        )
    except pulsar.PulsarException as error:
        raise PulsarReadError(f"cannot look up the last message of {topic}: {error}") from None
    try:
        last = consumer.get_last_message_id()
    except pulsar.PulsarException as error:
        # pulsar-lite answers an empty topic with an error (UnknownError); make sure.
        if _is_empty(client, topic):
            return BEFORE_EARLIEST
        raise PulsarReadError(f"cannot look up the last message of {topic}: {error}") from None
    finally:
        try:
            consumer.unsubscribe()
        except pulsar.PulsarException:
            consumer.close()
    # Apache Pulsar answers an empty topic with entry -1.
    return BEFORE_EARLIEST if last.entry_id() < 0 else end_position(last)


def _is_empty(client: pulsar.Client, topic: str) -> bool:
    """Whether a reader from the earliest message finds nothing in a short while."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        reader.read_next(_EMPTY_PROBE_MS)
    except pulsar.Timeout:
        return True
    finally:
        reader.close()
    return False
