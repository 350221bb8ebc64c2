"""Apache Pulsar standalone, from the jars Maven fetched: the real broker for tests and benchmarks.

``make apache-pulsar`` (part of ``make install``) resolves the release pinned in
``apache-pulsar/pom.xml`` into the local Maven repository and writes its classpath to
``apache-pulsar/classpath.txt``. :class:`ApachePulsarStandalone` runs
``org.apache.pulsar.PulsarStandaloneStarter`` from that classpath: broker and bookie in one JVM,
on free loopback ports (binary protocol, HTTP admin API, bookie), with its data in a directory
of its own, the functions worker off (Magnetar is the functions worker) and a bounded heap.
Compaction and deduplication are there, switched on per topic or namespace through the admin
API, as on any Apache Pulsar cluster. With ``authorization=TokenAuthorization(...)`` the broker
authenticates every client by its token (HS256, ``AuthenticationProviderToken``) and authorizes
each topic operation by its role, as a production cluster does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import jwt

from magnetar.broker import dying_with_parent, find_free_port
from magnetar.testing._jvm import ClassSharing, archive_path, java
from magnetar.testing.exceptions import ApachePulsarError

__all__ = ["CLASSPATH_FILE", "ApachePulsarError", "ApachePulsarStandalone", "TokenAuthorization"]

CLASSPATH_FILE = Path(__file__).resolve().parents[2] / "apache-pulsar" / "classpath.txt"
"""Where ``make apache-pulsar`` writes the broker's classpath (in a source checkout)."""

_STARTER = "org.apache.pulsar.PulsarStandaloneStarter"
_BIND_ATTEMPTS = 3
_ADDRESS_IN_USE = "Address already in use"
_ARCHIVE_WRITE_S = 120.0

# The settings of the distribution's conf/standalone.conf that matter here, plus loopback ports.
# What Apache Pulsar's own launcher (bin/pulsar) opens to the broker on Java 17: without them
# Netty, BookKeeper and the metrics collectors log IllegalAccessException at start.
_JAVA_OPENS = (
    "java.base/java.io",
    "java.base/java.nio",
    "java.base/java.util.zip",
    "java.base/jdk.internal.misc",
    "java.base/jdk.internal.platform",
    "java.base/sun.net",
    "java.management/sun.management",
    "jdk.management/com.sun.management.internal",
)

_CONFIG = """\
clusterName=standalone
bindAddress={host}
advertisedAddress={host}
brokerServicePort={broker_port}
webServicePort={web_port}
functionsWorkerEnabled=false
webSocketServiceEnabled=false
loadManagerClassName=org.apache.pulsar.broker.loadbalance.NoopLoadManager
loadBalancerEnabled=false
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
brokerDeleteInactiveTopicsEnabled=true
brokerDeduplicationEnabled=false
systemTopicEnabled=true
topicLevelPoliciesEnabled=true
brokerShutdownTimeoutMs={shutdown_ms}
keepAliveIntervalSeconds={keep_alive_s}
ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage
bookkeeperUseV2WireProtocol=true
journalMaxGroupWaitMSec=1
journalSyncData=false
allowLoopback=true
listeningInterface=lo
diskUsageThreshold=0.99
diskUsageWarnThreshold=0.99
dbStorage_rocksDB_writeBufferSizeMB=4
dbStorage_rocksDB_sstSizeInMB=4
"""

# Token authentication and role authorization; the broker's own clients (the standalone
# creating public/default, the broker talking to itself) use a superuser's token.
_AUTHORIZATION_CONFIG = """\
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken
tokenSecretKey=file://{key_file}
authorizationEnabled=true
superUserRoles={superusers}
brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
brokerClientAuthenticationParameters=token:{broker_token}
"""


@dataclass(frozen=True)
class TokenAuthorization:
    """Token authentication and authorization on: tokens are HS256 JWTs signed with
    ``secret_key`` whose ``sub`` is the role (as ``pulsar tokens create`` makes them);
    ``superuser_roles`` may do everything, the first of them is the broker's own role."""

    secret_key: bytes = field(repr=False)
    superuser_roles: tuple[str, ...] = ("admin",)

    def __post_init__(self) -> None:
        if len(self.secret_key) < 32:
            raise ApachePulsarError("an HS256 secret key has at least 32 bytes")
        if not self.superuser_roles:
            raise ApachePulsarError("the broker needs a superuser role for its own clients")

    def token(self, role: str) -> str:
        """A token for ``role``, without expiry."""
        return jwt.encode({"sub": role}, self.secret_key, algorithm="HS256")

    @property
    def superuser_token(self) -> str:
        return self.token(self.superuser_roles[0])


_LOG4J = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="error" shutdownHook="disable">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{{ISO8601}} %-5level [%t] %c{{1}} - %msg%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="{level}"><AppenderRef ref="stdout"/></Root>
    <!-- harmless on one machine: a bookie without a rack -->
    <Logger name="org.apache.bookkeeper.client.TopologyAwareEnsemblePlacementPolicy" level="error"/>
  </Loggers>
</Configuration>
"""


# Jersey logs through java.util.logging; its WADL warning at every start means nothing here.
_JUL = """\
handlers=java.util.logging.ConsoleHandler
java.util.logging.ConsoleHandler.level=ALL
.level={level}
org.glassfish.jersey.server.wadl.level=SEVERE
"""
_JUL_LEVELS = {
    "error": "SEVERE",
    "warn": "WARNING",
    "info": "INFO",
    "debug": "FINE",
    "trace": "FINEST",
}


def _classpath(explicit: str | None, classpath_file: Path) -> str:
    """The broker's classpath: ``explicit``, ``MAGNETAR_APACHE_PULSAR_CLASSPATH``, or the one
    ``make apache-pulsar`` wrote; every jar it names must be there."""
    classpath = explicit or os.environ.get("MAGNETAR_APACHE_PULSAR_CLASSPATH")
    if not classpath:
        try:
            classpath = classpath_file.read_text().strip()
        except FileNotFoundError:
            raise ApachePulsarError(
                f"Apache Pulsar's jars have not been fetched ({classpath_file} is missing): run "
                "`make apache-pulsar` (it needs Maven), or set MAGNETAR_APACHE_PULSAR_CLASSPATH "
                "to a Pulsar distribution's lib, e.g. '/opt/pulsar/lib/*'"
            ) from None
    for entry in classpath.split(os.pathsep):
        if entry and not entry.endswith("*") and not Path(entry).exists():
            raise ApachePulsarError(
                f"{entry} is on Apache Pulsar's classpath but missing (was the Maven repository "
                "cleaned?); run `make apache-pulsar` again"
            )
    return classpath


class ApachePulsarStandalone:
    """An Apache Pulsar standalone in a JVM of its own, usable as a context manager.

    ``data_dir`` holds the configuration, the bookie's and the metadata store's data and the
    log (``pulsar.log``, at the level ``MAGNETAR_BROKER_LOG_LEVEL`` names; warn by default).
    ``heap_mb`` bounds the Java heap and, as much again, its direct memory; ``keep_alive_s`` is
    how often the broker pings its clients to find dead connections. ``quick_start`` compiles
    with the JIT's first tier only: a third of the CPU to start, for a slower broker at full
    load (right for tests, not for benchmarks). The classes loaded by the first start are
    archived (class data sharing), which makes every later start cheaper. ``classpath`` (a
    Java classpath, e.g. a Pulsar distribution's ``lib/*``) or ``classpath_file`` replace the
    classpath ``make apache-pulsar`` wrote. ``authorization`` turns token authentication and
    authorization on (:meth:`admin` then calls as the first superuser). ``settings`` are more
    ``standalone.conf`` settings (a later one wins). The process ends when its parent does (on
    Linux), and :meth:`stop` shuts it down gracefully.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        heap_mb: int = 512,
        startup_timeout: float = 120.0,
        keep_alive_s: int = 30,
        quick_start: bool = False,
        classpath: str | None = None,
        classpath_file: str | os.PathLike[str] = CLASSPATH_FILE,
        authorization: TokenAuthorization | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.authorization = authorization
        self.settings = dict(settings or {})
        self.data_dir = Path(data_dir)
        self.host = host
        self.heap_mb = heap_mb
        self.startup_timeout = startup_timeout
        self.keep_alive_s = keep_alive_s
        self.quick_start = quick_start
        self._explicit_classpath = classpath
        self._classpath_file = Path(classpath_file)
        self._class_sharing = ClassSharing(None)
        self._log_offset = 0
        self.broker_port: int | None = None
        self.web_port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        """Seconds from launching the JVM to serving (set by :meth:`start`)."""

    @property
    def service_url(self) -> str:
        """The ``pulsar://`` URL clients connect to."""
        if self.broker_port is None:
            raise ApachePulsarError("Apache Pulsar has not been started")
        return f"pulsar://{self.host}:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        """The HTTP service URL of the admin API (``--pulsar-admin-url``)."""
        if self.web_port is None:
            raise ApachePulsarError("Apache Pulsar has not been started")
        return f"http://{self.host}:{self.web_port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "pulsar.log"

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call of the admin API (``path`` from ``/admin/v2/...``), as a superuser when
        authorization is on (unless ``headers`` say otherwise)."""
        kwargs.setdefault("timeout", 30)
        kwargs["headers"] = {**self._superuser_headers(), **(kwargs.get("headers") or {})}
        return httpx.request(method, self.admin_url + path, **kwargs)

    def _superuser_headers(self) -> dict[str, str]:
        if self.authorization is None:
            return {}
        return {"Authorization": f"Bearer {self.authorization.superuser_token}"}

    def start(self) -> ApachePulsarStandalone:
        """Start the JVM and wait until the broker serves ``public/default``."""
        java_binary = java()
        classpath = _classpath(self._explicit_classpath, self._classpath_file)
        level = os.environ.get("MAGNETAR_BROKER_LOG_LEVEL", "warn").lower()
        if level not in _JUL_LEVELS:
            raise ApachePulsarError(
                f"MAGNETAR_BROKER_LOG_LEVEL={level!r} is not one of {', '.join(_JUL_LEVELS)}"
            )
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir / "log4j2.xml").write_text(_LOG4J.format(level=level))
            (self.data_dir / "jul.properties").write_text(_JUL.format(level=_JUL_LEVELS[level]))
        except OSError as error:
            raise ApachePulsarError(
                f"cannot use {self.data_dir} as Apache Pulsar's data directory: {error.strerror}"
            ) from error
        self._class_sharing = ClassSharing(archive_path(java_binary, classpath))
        self.startup_s = None
        for attempt in range(_BIND_ATTEMPTS):
            launched = time.monotonic()
            self._launch(java_binary, classpath)
            try:
                self._wait_until_serving()
            except ApachePulsarError:
                # Another process may have taken a port between choosing and binding it.
                if attempt + 1 < _BIND_ATTEMPTS and _ADDRESS_IN_USE in self._log_since_launch():
                    continue
                self._class_sharing.discard()
                raise
            self.startup_s = time.monotonic() - launched
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _jit_options(self) -> list[str]:
        return ["-XX:TieredStopAtLevel=1"] if self.quick_start else []

    def _launch(self, java: str, classpath: str) -> None:
        self.broker_port = find_free_port(self.host)
        self.web_port = find_free_port(self.host)
        bookie_port = find_free_port(self.host)
        config = self.data_dir / "standalone.conf"
        config.write_text(
            _CONFIG.format(
                host=self.host,
                broker_port=self.broker_port,
                web_port=self.web_port,
                shutdown_ms=5000,
                keep_alive_s=self.keep_alive_s,
            )
            + self._authorization_config()
            + "".join(f"{key}={value}\n" for key, value in self.settings.items())
        )
        command = [
            java,
            f"-Xms{self.heap_mb}m",
            f"-Xmx{self.heap_mb}m",
            f"-XX:MaxDirectMemorySize={self.heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            *self._jit_options(),
            *self._class_sharing.options(),
            *(f"--add-opens={module}=ALL-UNNAMED" for module in _JAVA_OPENS),
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j.configurationFile={self.data_dir / 'log4j2.xml'}",
            f"-Djava.util.logging.config.file={self.data_dir / 'jul.properties'}",
            "-Dlog4j2.is.webapp=false",
            "-Dbookkeeper.metadata.bookie.drivers="
            "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver",
            "-Dbookkeeper.metadata.client.drivers="
            "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver",
            "-cp",
            classpath,
            _STARTER,
            "--config",
            str(config),
            "--no-functions-worker",
            "--no-stream-storage",
            "--bookkeeper-port",
            str(bookie_port),
            "--bookkeeper-dir",
            str(self.data_dir / "bookkeeper"),
            "--metadata-dir",
            str(self.data_dir / "metadata"),
        ]
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._process = subprocess.Popen(
                dying_with_parent(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # Ctrl-C reaches the test run, which stops it last
            )

    def _authorization_config(self) -> str:
        """The settings of token authorization, its key in a file for the broker alone."""
        if self.authorization is None:
            return ""
        key_file = self.data_dir / "token-secret.key"
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(self.authorization.secret_key)
        return _AUTHORIZATION_CONFIG.format(
            key_file=key_file.resolve(),
            superusers=",".join(self.authorization.superuser_roles),
            broker_token=self.authorization.superuser_token,
        )

    def _wait_until_serving(self) -> None:
        """Until the admin API lists ``public/default``, which the standalone creates once its
        broker runs; the JVM's exit or the timeout raises with the log's end."""
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer yet"
        # Asked in this order, none of the questions makes the broker log an error.
        questions = [
            ("/admin/v2/tenants", "public"),
            ("/admin/v2/namespaces/public", "public/default"),
        ]
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise ApachePulsarError(
                    f"Apache Pulsar exited with code {code} while starting; its log "
                    f"({self.log_path}) ends with:\n{self._log_tail()}"
                )
            path, wanted = questions[0]
            try:
                answer = httpx.get(
                    self.admin_url + path, headers=self._superuser_headers(), timeout=2
                )
                if answer.status_code == 200 and wanted in answer.json():
                    questions.pop(0)
                    if not questions:
                        return
                    continue
                last = f"GET {path}: HTTP {answer.status_code} {answer.text[:100]!r}"
            except (httpx.HTTPError, ValueError) as error:
                last = f"GET {path}: {type(error).__name__}: {error}"
            time.sleep(0.1)
        self.stop(timeout=5)
        raise ApachePulsarError(
            f"Apache Pulsar did not serve within {self.startup_timeout:.0f} s ({last}); its log "
            f"({self.log_path}) ends with:\n{self._log_tail()}"
        )

    def _log_since_launch(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """Shut down gracefully (SIGTERM runs Pulsar's shutdown hook); SIGKILL after
        ``timeout`` seconds."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            if self._class_sharing.writing:  # the JVM writes its archive as it exits
                timeout = max(timeout, _ARCHIVE_WRITE_S)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.startup_s is not None:
            self._class_sharing.keep()
        else:
            self._class_sharing.discard()

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> ApachePulsarStandalone:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
