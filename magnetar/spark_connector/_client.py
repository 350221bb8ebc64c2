"""Pulsar clients for the driver and the executors, and what the driver asks the broker.

Options cross to executors as plain strings (an ``Authentication`` object cannot be
pickled), so every process builds its own client from them here.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulsar

from magnetar.spark_connector._offsets import BEFORE_EARLIEST, Position, end_position
from magnetar.spark_connector.exceptions import InvalidOptionError, PulsarReadError

__all__ = ["last_position", "open_client", "topic_partitions"]

_EMPTY_PROBE_MS = 200
"""How long a topic must stay silent from its earliest message to count as empty."""


def open_client(service_url: str, client_conf: Mapping[str, str]) -> pulsar.Client:
    """A client for ``service_url`` configured by ``pulsar.client.*`` options (Java names)."""
    kwargs: dict[str, Any] = {"logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)}
    for name, value in client_conf.items():
        if name == "operationTimeoutMs":
            kwargs["operation_timeout_seconds"] = max(1, math.ceil(_int(name, value) / 1000))
        elif name == "connectionTimeoutMs":
            kwargs["connection_timeout_ms"] = _int(name, value)
        elif name == "ioThreads":
            kwargs["io_threads"] = _int(name, value)
        elif name == "useTls":
            kwargs["use_tls"] = _flag(name, value)
        elif name == "tlsAllowInsecureConnection":
            kwargs["tls_allow_insecure_connection"] = _flag(name, value)
        elif name == "tlsHostnameVerificationEnable":
            kwargs["tls_validate_hostname"] = _flag(name, value)
        elif name == "tlsTrustCertsFilePath":
            kwargs["tls_trust_certs_file_path"] = value
        elif name == "listenerName":
            kwargs["listener_name"] = value
    plugin = client_conf.get("authPluginClassName")
    if plugin:
        kwargs["authentication"] = _authentication(plugin, client_conf.get("authParams", ""))
    elif "authParams" in client_conf:
        raise InvalidOptionError(
            "pulsar.client.authParams is set but pulsar.client.authPluginClassName is not"
        )
    try:
        return pulsar.Client(service_url, **kwargs)
    except pulsar.PulsarException as error:
        raise InvalidOptionError(
            f"cannot create a Pulsar client for {service_url}: {error}"
        ) from None


def _authentication(plugin: str, params: str) -> Any:
    """The Python counterpart of a Java ``authPluginClassName``, or a C++ plugin library."""
    name = plugin.rsplit(".", 1)[-1]
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


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidOptionError(
            f"pulsar.client.{name} must be an integer, got {value!r}"
        ) from None


def _flag(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise InvalidOptionError(f"pulsar.client.{name} must be true or false, got {value!r}")
    return value.lower() == "true"


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
