"""The ``pulsar.client.*``, ``pulsar.admin.*``, ``pulsar.reader.*`` and ``pulsar.producer.*``
options: the Java client's configuration fields, as the StreamNative connector accepts them.

StreamNative hands these to the Java client's ``loadConf``, so any field of
``ClientConfigurationData``, ``ReaderConfigurationData`` or ``ProducerConfigurationData`` is
accepted (matched without regard to case) and anything else fails with "... not supported by
pulsar". Here each field gets one of three treatments:

* *mapped*: passed to the Python client under its own name, converted;
* *tuning*: a knob of the Java client with no bearing on what is read or written, which the
  Python client does not have (thread pools, back-off, lookup limits): accepted, no effect;
* *refused*: a setting whose meaning cannot be kept (Java KeyStores, proxies, listeners,
  interceptors): an error that says why, rather than quietly reading or writing otherwise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from magnetar.spark_connector.exceptions import InvalidOptionError

__all__ = [
    "ADMIN_PREFIX",
    "CLIENT_PREFIX",
    "PRODUCER_PREFIX",
    "READER_PREFIX",
    "Module",
    "check_module_options",
    "client_kwargs",
    "producer_kwargs",
    "reader_kwargs",
]

Module = Literal["client", "admin", "reader", "producer"]

CLIENT_PREFIX = "pulsar.client."
ADMIN_PREFIX = "pulsar.admin."
READER_PREFIX = "pulsar.reader."
PRODUCER_PREFIX = "pulsar.producer."

Convert = Callable[[str, str], Any]
"""``(option name, text) -> value`` for the Python client; raises InvalidOptionError."""


def _int(option: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidOptionError(f"{option} must be an integer, got {text!r}") from None


def _flag(option: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(f"{option} must be true or false, got {text!r}")
    return value == "true"


def _text(option: str, text: str) -> str:
    return text


def _seconds_from_ms(option: str, text: str) -> int:
    return max(1, math.ceil(_int(option, text) / 1000))


def _ms_from_micros(option: str, text: str) -> int:
    return max(1, math.ceil(_int(option, text) / 1000))


def _choice(names: Mapping[str, str]) -> Convert:
    """A Java enum constant (any case) -> the Python client's constant, named by
    ``"Kind.CONSTANT"``."""
    by_lower = {java.lower(): python for java, python in names.items()}

    def convert(option: str, text: str) -> Any:
        import pulsar

        found = by_lower.get(text.strip().lower())
        if found is None:
            raise InvalidOptionError(
                f"{option} must be one of {', '.join(sorted(names))}, got {text!r}"
            )
        kind, _, constant = found.partition(".")
        return getattr(getattr(pulsar, kind), constant)

    return convert


def _string_map(option: str, text: str) -> dict[str, str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidOptionError(f"{option} must be a JSON object of strings, got {text!r}")
    return value


@dataclass(frozen=True)
class _Field:
    """One Java configuration field and what becomes of it."""

    java: str
    """The Java field name (what users write)."""
    python: str | None = None
    """The Python client's keyword; None: handled elsewhere, or not at all."""
    convert: Convert = _text
    refused: str | None = None
    """Why a value (any, or the one in ``refused_value``) cannot be honoured."""
    refused_value: str | None = None
    """Refuse only this value (lower case); None refuses every value."""


def _tuning(*names: str) -> list[_Field]:
    return [_Field(name) for name in names]


_NO_KEYSTORE = "Java KeyStores are Java-only: give PEM files (tlsTrustCertsFilePath etc.)"
_NO_PROXY = "the Python Pulsar client cannot connect through a proxy; connect to the brokers"
_NO_OBJECT = "it takes a Java object, which a Spark option cannot carry"
_NOT_HERE = "the connector sets this itself"

_CLIENT_FIELDS = [
    _Field("serviceUrl", refused=f"{_NOT_HERE}: use the option service.url"),
    _Field("serviceUrlProvider", refused=_NO_OBJECT),
    _Field("authentication", refused=f"{_NO_OBJECT}; use authPluginClassName and authParams"),
    _Field("authPluginClassName"),  # both read by open_client
    _Field("authParams"),
    _Field("authParamMap", convert=_string_map),
    _Field("operationTimeoutMs", "operation_timeout_seconds", _seconds_from_ms),
    _Field("statsIntervalSeconds", "stats_interval_in_seconds", _int),
    _Field("numIoThreads", "io_threads", _int),
    _Field("numListenerThreads", "message_listener_threads", _int),
    _Field("concurrentLookupRequest", "concurrent_lookup_requests", _int),
    _Field("useTls", "use_tls", _flag),
    _Field("tlsTrustCertsFilePath", "tls_trust_certs_file_path"),
    _Field("tlsAllowInsecureConnection", "tls_allow_insecure_connection", _flag),
    _Field("tlsHostnameVerificationEnable", "tls_validate_hostname", _flag),
    _Field("tlsKeyFilePath", "tls_private_key_file_path"),
    _Field("tlsCertificateFilePath", "tls_certificate_file_path"),
    _Field("connectionTimeoutMs", "connection_timeout_ms", _int),
    _Field("listenerName", "listener_name"),
    _Field("useKeyStoreTls", refused=_NO_KEYSTORE, refused_value="true"),
    _Field("tlsTrustStoreType", refused=_NO_KEYSTORE),
    _Field("tlsTrustStorePath", refused=_NO_KEYSTORE),
    _Field("tlsTrustStorePassword", refused=_NO_KEYSTORE),
    _Field("tlsKeyStoreType", refused=_NO_KEYSTORE),
    _Field("tlsKeyStorePath", refused=_NO_KEYSTORE),
    _Field("tlsKeyStorePassword", refused=_NO_KEYSTORE),
    _Field("sslProvider", refused="the Python client uses OpenSSL, which cannot be changed"),
    _Field("tlsCiphers", refused="the Python client cannot restrict TLS ciphers"),
    _Field("tlsProtocols", refused="the Python client cannot restrict TLS protocol versions"),
    _Field("proxyServiceUrl", refused=_NO_PROXY),
    _Field("proxyProtocol", refused=_NO_PROXY),
    _Field("socks5ProxyAddress", refused=_NO_PROXY),
    _Field("socks5ProxyUsername", refused=_NO_PROXY),
    _Field("socks5ProxyPassword", refused=_NO_PROXY),
    _Field("clock", refused=_NO_OBJECT),
    *_tuning(
        "connectionsPerBroker",
        "useTcpNoDelay",
        "maxLookupRequest",
        "maxLookupRedirects",
        "maxNumberOfRejectedRequestPerConnection",
        "keepAliveIntervalSeconds",
        "requestTimeoutMs",
        "readTimeoutMs",
        "autoCertRefreshSeconds",
        "lookupTimeoutMs",
        "initialBackoffIntervalNanos",
        "maxBackoffIntervalNanos",
        "enableBusyWait",
        "memoryLimitBytes",
        "enableTransaction",
        "connectionMaxIdleSeconds",
        "dnsLookupBindAddress",
        "dnsLookupBindPort",
        "description",
    ),
]

_READER_FIELDS = [
    _Field("topicNames", refused=f"{_NOT_HERE}: use the options topic, topics or topicsPattern"),
    _Field("receiverQueueSize", "receiver_queue_size", _int),
    _Field("readerName", "reader_name"),
    # Every range gets readers of its own, so a fixed subscription name cannot be used as
    # it is: both name the prefix of the readers' subscriptions (see read_settings).
    _Field("subscriptionRolePrefix"),
    _Field("subscriptionName"),
    _Field("readCompacted", "is_read_compacted", _flag),
    _Field(
        "cryptoFailureAction",
        "crypto_failure_action",
        _choice(
            {
                "FAIL": "ConsumerCryptoFailureAction.FAIL",
                "DISCARD": "ConsumerCryptoFailureAction.DISCARD",
                "CONSUME": "ConsumerCryptoFailureAction.CONSUME",
            }
        ),
    ),
    _Field("startPaused", refused="a paused reader would read nothing", refused_value="true"),
    _Field("readerListener", refused=_NO_OBJECT),
    _Field("cryptoKeyReader", refused=_NO_OBJECT),
    _Field("keyHashRanges", refused="a range read must see every key"),
    _Field("readerInterceptorList", refused=_NO_OBJECT),
    *_tuning(
        "resetIncludeHead",
        "poolMessages",
        "autoUpdatePartitions",
        "autoUpdatePartitionsIntervalSeconds",
        "maxPendingChunkedMessage",
        "autoAckOldestChunkedMessageOnQueueFull",
        "expireTimeOfIncompleteChunkedMessageMillis",
    ),
]

_PRODUCER_FIELDS = [
    _Field("topicName", refused=f"{_NOT_HERE}: use the option topic or a __topic column"),
    _Field("producerName", "producer_name"),
    _Field("sendTimeoutMs", "send_timeout_millis", _int),
    _Field("blockIfQueueFull", "block_if_queue_full", _flag),
    _Field("maxPendingMessages", "max_pending_messages", _int),
    _Field("maxPendingMessagesAcrossPartitions", "max_pending_messages_across_partitions", _int),
    _Field(
        "messageRoutingMode",
        "message_routing_mode",
        _choice(
            {
                "RoundRobinPartition": "PartitionsRoutingMode.RoundRobinDistribution",
                "SinglePartition": "PartitionsRoutingMode.UseSinglePartition",
            }
        ),
    ),
    _Field("batchingMaxPublishDelayMicros", "batching_max_publish_delay_ms", _ms_from_micros),
    _Field("batchingMaxMessages", "batching_max_messages", _int),
    _Field("batchingMaxBytes", "batching_max_allowed_size_in_bytes", _int),
    _Field("batchingEnabled", "batching_enabled", _flag),
    _Field("chunkingEnabled", "chunking_enabled", _flag),
    _Field(
        "compressionType",
        "compression_type",
        _choice(
            {
                "NONE": "CompressionType.NONE",
                "LZ4": "CompressionType.LZ4",
                "ZLIB": "CompressionType.ZLib",
                "ZSTD": "CompressionType.ZSTD",
                "SNAPPY": "CompressionType.SNAPPY",
            }
        ),
    ),
    _Field("initialSequenceId", "initial_sequence_id", _int),
    _Field(
        "accessMode",
        "access_mode",
        _choice(
            {
                "Shared": "ProducerAccessMode.Shared",
                "Exclusive": "ProducerAccessMode.Exclusive",
                "WaitForExclusive": "ProducerAccessMode.WaitForExclusive",
                "ExclusiveWithFencing": "ProducerAccessMode.ExclusiveWithFencing",
            }
        ),
    ),
    _Field("lazyStartPartitionedProducers", "lazy_start_partitioned_producers", _flag),
    _Field("properties", "properties", _string_map),
    _Field("initialSubscriptionName"),  # created by the writer, see _writer
    _Field(
        "cryptoFailureAction",
        refused="encryption needs a cryptoKeyReader, a Java object",
        refused_value="send",
    ),
    _Field("customMessageRouter", refused=_NO_OBJECT),
    _Field("batcherBuilder", refused=_NO_OBJECT),
    _Field("cryptoKeyReader", refused=_NO_OBJECT),
    _Field("messageCrypto", refused=_NO_OBJECT),
    _Field("encryptionKeys", refused="encryption needs a cryptoKeyReader, a Java object"),
    *_tuning(
        "hashingScheme",
        "batchingPartitionSwitchFrequencyByPublishDelay",
        "chunkMaxMessageSize",
        "autoUpdatePartitions",
        "autoUpdatePartitionsIntervalSeconds",
        "multiSchema",
    ),
]

_FIELDS: dict[Module, dict[str, _Field]] = {
    "client": {f.java.lower(): f for f in _CLIENT_FIELDS},
    # StreamNative reads the admin options with the client's field names.
    "admin": {f.java.lower(): f for f in _CLIENT_FIELDS},
    "reader": {f.java.lower(): f for f in _READER_FIELDS},
    "producer": {f.java.lower(): f for f in _PRODUCER_FIELDS},
}
_PREFIXES: dict[Module, str] = {
    "client": CLIENT_PREFIX,
    "admin": ADMIN_PREFIX,
    "reader": READER_PREFIX,
    "producer": PRODUCER_PREFIX,
}


def check_module_options(module: Module, opts: Mapping[str, str]) -> dict[str, str]:
    """The ``pulsar.<module>.*`` options of ``opts`` (lower-cased keys), checked, by their
    Java field names; raises :class:`InvalidOptionError` for an unknown field, a refused one
    or a malformed value."""
    prefix = _PREFIXES[module]
    fields = _FIELDS[module]
    found: dict[str, str] = {}
    for key, text in opts.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        field = fields.get(name)
        option = prefix + (field.java if field else name)
        if field is None:
            raise InvalidOptionError(
                f"{option}: {name} not supported by pulsar; the {module} fields are those of "
                f"the Java client's {_config_class(module)}"
            )
        if field.refused is not None and (
            field.refused_value is None or text.strip().lower() == field.refused_value
        ):
            raise InvalidOptionError(f"{option}={text!r} is not supported here: {field.refused}")
        field.convert(option, text)  # fail now, not on an executor
        found[field.java] = text
    return found


def _config_class(module: Module) -> str:
    return {
        "client": "ClientConfigurationData",
        "admin": "ClientConfigurationData",
        "reader": "ReaderConfigurationData",
        "producer": "ProducerConfigurationData",
    }[module]


def _kwargs(module: Module, conf: Mapping[str, str]) -> dict[str, Any]:
    fields = _FIELDS[module]
    prefix = _PREFIXES[module]
    kwargs: dict[str, Any] = {}
    for name, text in conf.items():
        field = fields[name.lower()]
        if field.python is not None:
            kwargs[field.python] = field.convert(prefix + field.java, text)
    return kwargs


def client_kwargs(conf: Mapping[str, str]) -> dict[str, Any]:
    """``pulsar.Client`` keywords for checked ``pulsar.client.*`` fields (authentication
    aside)."""
    return _kwargs("client", conf)


def reader_kwargs(conf: Mapping[str, str]) -> dict[str, Any]:
    """``Client.create_reader`` keywords for checked ``pulsar.reader.*`` fields."""
    return _kwargs("reader", conf)


def producer_kwargs(conf: Mapping[str, str]) -> dict[str, Any]:
    """``Client.create_producer`` keywords for checked ``pulsar.producer.*`` fields."""
    return _kwargs("producer", conf)
