"""Apache Pulsar's own ``pulsar-admin``, from the jars Maven fetched, pointed at a Magnetar
worker: the real Java CLI (``org.apache.pulsar.admin.cli.PulsarAdminTool`` of
``pulsar-client-tools``), to check that Pulsar's tools work against Magnetar unchanged.

``make apache-pulsar`` (part of ``make install``) resolves the release pinned in
``apache-pulsar/pulsar-admin/pom.xml`` and writes its classpath beside it. :meth:`PulsarAdmin.run`
is one JVM per command, as ``bin/pulsar-admin`` (2-3 s of CPU, more on a busy machine);
:meth:`PulsarAdmin.shell` runs many commands through ``PulsarAdminTool.execute`` in one JVM
(``PulsarAdminShell.java``, beside the pom), the same code path without a JVM start each.
"""

from __future__ import annotations

import queue
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from magnetar.testing._jvm import ClassSharing, archive_path, java
from magnetar.testing.exceptions import ApachePulsarError

__all__ = ["PULSAR_ADMIN_CLASSPATH_FILE", "AdminShell", "PulsarAdmin"]

PULSAR_ADMIN_CLASSPATH_FILE = (
    Path(__file__).resolve().parents[2] / "apache-pulsar" / "pulsar-admin" / "classpath.txt"
)
"""Where ``make apache-pulsar`` writes pulsar-admin's classpath (in a source checkout)."""

_MAIN = "org.apache.pulsar.admin.cli.PulsarAdminTool"
_SHELL = PULSAR_ADMIN_CLASSPATH_FILE.with_name("PulsarAdminShell.java")
_END = "\0END "
_TEST_MODE_EXIT = "Exit code is "
"""What PulsarAdminTool prints instead of exiting, in the test mode the shell runs it in."""


class PulsarAdmin:
    """``pulsar-admin`` against ``web_service_url`` (a Magnetar worker's admin URL)."""

    def __init__(self, web_service_url: str, timeout_s: float = 120.0) -> None:
        if not PULSAR_ADMIN_CLASSPATH_FILE.is_file():
            raise ApachePulsarError(
                f"pulsar-admin's classpath {PULSAR_ADMIN_CLASSPATH_FILE} is missing: run "
                "`make apache-pulsar` (it needs Java 17 and Maven)"
            )
        self._classpath = PULSAR_ADMIN_CLASSPATH_FILE.read_text().strip()
        self._java = java()
        self._timeout_s = timeout_s
        self._directory = tempfile.TemporaryDirectory(prefix="pulsar-admin-")
        self._conf = Path(self._directory.name) / "client.conf"
        # the first argument of PulsarAdminTool: a client.conf, as bin/pulsar-admin passes it
        self._conf.write_text(f"webServiceUrl={web_service_url}\n")
        self._sharing = ClassSharing(archive_path(self._java, self._classpath))

    def _jvm(self) -> list[str]:
        return [
            self._java,
            *self._sharing.options(),
            "-XX:TieredStopAtLevel=1",  # short-lived: the quick compiler is enough
            "-Xmx256m",
            "-cp",
            self._classpath,
        ]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pulsar-admin args...`` in a JVM of its own: its exit code, stdout and stderr."""
        command = [*self._jvm(), _MAIN, str(self._conf), *args]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=self._timeout_s, check=False
        )
        if self._sharing.writing:
            self._sharing.keep()
        return done

    @contextmanager
    def shell(self) -> Iterator[AdminShell]:
        """One JVM that runs command after command (ended on leaving the block)."""
        process = subprocess.Popen(
            [*self._jvm(), str(_SHELL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        try:
            yield AdminShell(process, self._conf, self._timeout_s)
        finally:
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            self._sharing.discard()

    def close(self) -> None:
        self._directory.cleanup()


class AdminShell:
    """pulsar-admin commands, one after the other, in one JVM (see ``PulsarAdminShell``)."""

    def __init__(self, process: subprocess.Popen[str], conf: Path, timeout_s: float) -> None:
        self._process = process
        self._conf = conf
        self._timeout_s = timeout_s
        assert process.stdout is not None and process.stderr is not None
        self._stdout = _lines(process.stdout)
        self._stderr = _lines(process.stderr)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pulsar-admin args...``: its exit code, stdout and stderr."""
        if any(character in arg for arg in args for character in "\t\n"):
            raise ValueError(f"an argument holds a tab or a newline: {args!r}")
        assert self._process.stdin is not None
        self._process.stdin.write("\t".join([str(self._conf), *args]) + "\n")
        self._process.stdin.flush()
        stdout, code = self._until_end(self._stdout, args)
        stderr, _ = self._until_end(self._stderr, args)
        kept = [line for line in stdout if not line.startswith(_TEST_MODE_EXIT)]
        return subprocess.CompletedProcess(list(args), code, "".join(kept), "".join(stderr))

    def _until_end(
        self, lines: queue.Queue[str | None], args: tuple[str, ...]
    ) -> tuple[list[str], int]:
        read: list[str] = []
        while True:
            try:
                line = lines.get(timeout=self._timeout_s)
            except queue.Empty:
                raise TimeoutError(f"pulsar-admin {' '.join(args)}: no answer") from None
            if line is None:
                raise RuntimeError(f"pulsar-admin's JVM ended during {' '.join(args)}: {read}")
            if line.startswith(_END):
                return read, int(line[len(_END) :])
            read.append(line)


def _lines(stream: IO[str]) -> queue.Queue[str | None]:
    """The lines of ``stream`` as they come (None at its end), read by a thread."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True, name="pulsar-admin-output").start()
    return lines
