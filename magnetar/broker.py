"""The embedded broker: a pulsar-lite process on a free loopback port.

Used by ``magnetar standalone``, ``localrun`` without ``--broker-url`` and the tests.
pulsar-lite serves Prometheus metrics on 0.0.0.0:8080 unless told otherwise, which
collides with the worker's HTTP port and with other brokers, so it is always started
with a config file that turns metrics off. A healer (``magnetar.broker_healer``) restarts
it when a dead client's consumers would otherwise stay on their subscriptions.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from magnetar.broker_healer import BrokerHealer, Heal
from magnetar.exceptions import MagnetarError

__all__ = ["BrokerError", "EmbeddedBroker", "dying_with_parent", "find_free_port", "port_is_free"]

_CONFIG = "[metrics]\nenabled = false\n"


class BrokerError(MagnetarError):
    """The embedded broker could not be started or stopped."""


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``port`` of ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Connections a stopped broker closed linger in TIME_WAIT for a minute; servers (the
        # broker, uvicorn) bind over them, so they must not make the port look taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


_EXEC_DYING_WITH_PARENT = """\
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG, kept across exec
os.execv(sys.argv[1], sys.argv[1:])
"""


def dying_with_parent(command: list[str]) -> list[str]:
    """``command``, run so that on Linux it ends (SIGTERM) when the thread that started it
    dies, so a killed `magnetar standalone` or test run leaves no broker behind. A fresh,
    single-threaded interpreter sets this up and then becomes ``command`` (exec): doing it
    between fork and exec in a process with threads (pulsar-client's) can deadlock."""
    return [sys.executable, "-I", "-S", "-c", _EXEC_DYING_WITH_PARENT, *command]


def _find_binary() -> str:
    try:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary
    except ImportError as error:
        raise BrokerError(
            "pulsar-lite is not installed; run `make install` (or `pip install pulsar-lite`)"
        ) from error
    try:
        return str(find_pulsar_lite_binary())
    except FileNotFoundError as error:
        raise BrokerError(f"the pulsar-lite binary is missing: {error}") from error


class EmbeddedBroker:
    """A pulsar-lite broker process with a data directory, usable as a context manager.

    ``port=None`` picks a free loopback port. The broker's own log goes to
    ``<data_dir>/broker.log``, at the level ``MAGNETAR_BROKER_LOG_LEVEL`` names (error, warn,
    info, debug or trace; warn by default). ``keep_alive_s`` sets how often the broker pings
    clients (and how long it waits for the answer) to find dead connections. With ``heal``
    (the default) the broker is restarted on the same port and data directory when a client's
    connection ended without pulsar-lite cleaning up after it, or when it exited by itself;
    :attr:`heals` lists those restarts.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 15.0,
        keep_alive_s: int | None = None,
        heal: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self.keep_alive_s = keep_alive_s
        self.heal = heal
        self._process: subprocess.Popen[bytes] | None = None
        self._healer: BrokerHealer | None = None
        self._lifecycle = threading.Lock()
        self._wanted = False
        """Between start() and stop(): a broker that is not running must be started again."""
        # The broker dies with the *thread* that started it (PR_SET_PDEATHSIG), so every start,
        # the healer's restarts included, runs on this one thread, which lives until stop().
        self._spawner: ThreadPoolExecutor | None = None

    @property
    def service_url(self) -> str:
        """The ``pulsar://`` URL clients connect to."""
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"pulsar://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (for measuring what it costs)."""
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def heals(self) -> list[Heal]:
        """The restarts the healer made since :meth:`start`, oldest first."""
        return list(self._healer.heals) if self._healer is not None else []

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it accepts connections."""
        with self._lifecycle:
            self._spawner = ThreadPoolExecutor(1, thread_name_prefix="embedded-broker")
            try:
                self._launch(restart=False)
            except BaseException:
                self._spawner.shutdown()
                self._spawner = None
                raise
            self._wanted = True
        if self.heal:
            self._healer = BrokerHealer(self.log_path, self.restart, self._has_exited).start()
        return self

    def restart(self) -> None:
        """Stop the broker and start it again on the same port and data directory; clients
        reconnect by themselves. The healer calls this; tests and benchmarks may too."""
        with self._lifecycle:
            self._terminate()
            self._launch(restart=True)

    def _has_exited(self) -> bool:
        """Whether the broker should run but does not (False while it is being restarted)."""
        if not self._lifecycle.acquire(blocking=False):
            return False
        try:
            return self._wanted and (self._process is None or self._process.poll() is not None)
        finally:
            self._lifecycle.release()

    def _launch(self, restart: bool) -> None:
        binary = _find_binary()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            # every topic is stored here, the functions' records and their tokens among them
            self.data_dir.chmod(0o700)
            config = self.data_dir / "pulsar-lite.toml"
            config.write_text(self._config_text())
        except OSError as error:
            raise BrokerError(
                f"cannot use {self.data_dir} as the broker's data directory: {error.strerror}"
            ) from error
        if self.port is None:
            self.port = find_free_port(self.host)
        elif not restart and not port_is_free(self.host, self.port):
            raise BrokerError(
                f"port {self.port} on {self.host} is already in use; "
                "choose another broker port or stop what is listening there"
            )
        assert self._spawner is not None, "start() first"
        log = self.log_path.open("ab")
        try:
            command = [
                binary,
                "--config",
                str(config),
                "--addr",
                f"{self.host}:{self.port}",
                "--db-path",
                str(self.data_dir / "db"),
                "--log-level",
                os.environ.get("MAGNETAR_BROKER_LOG_LEVEL", "warn"),
            ]
            self._process = self._spawner.submit(
                subprocess.Popen,
                dying_with_parent(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # Ctrl-C reaches us, and we stop the broker last
            ).result()
        finally:
            log.close()
        self._wait_until_ready()

    def _config_text(self) -> str:
        if self.keep_alive_s is None:
            return _CONFIG
        # Pinging clients this often finds a paused or vanished client within ~2x this.
        return (
            f"keep_alive_interval_secs = {self.keep_alive_s}\n"
            f"connection_liveness_check_timeout_secs = {self.keep_alive_s}\n{_CONFIG}"
        )

    def _wait_until_ready(self) -> None:
        assert self._process is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerError(
                    f"pulsar-lite exited with code {self._process.returncode} before accepting "
                    f"connections; its log ({self.log_path}) ends with:\n{self._log_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.25):
                    return
            except OSError:
                time.sleep(0.05)
        self._terminate()
        raise BrokerError(
            f"pulsar-lite did not accept connections on {self.host}:{self.port} "
            f"within {self.startup_timeout:.0f}s; see {self.log_path}"
        )

    def _log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the healer, then the broker: SIGTERM, then SIGKILL if it does not exit
        within ``timeout``."""
        self._wanted = False
        if self._healer is not None:
            self._healer.stop()
        with self._lifecycle:
            self._terminate(timeout)
            if self._spawner is not None:
                self._spawner.shutdown()
                self._spawner = None

    def _terminate(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
