"""Apache Pulsar standalone from the jars Maven fetched: it serves on loopback ports, dies with
its parent, and says what is missing when it cannot start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pulsar
import pytest

from magnetar.testing import ApachePulsarError, ApachePulsarStandalone

pytestmark = [pytest.mark.brokers("apache"), pytest.mark.timeout(180)]

_STANDALONE_CHILD = """
import json, sys, time
from magnetar.testing import ApachePulsarStandalone
standalone = ApachePulsarStandalone(sys.argv[1], quick_start=True).start()
print(json.dumps([standalone.service_url, standalone.admin_url, standalone.pid]), flush=True)
time.sleep(600)
"""


def accepts_connections(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_a_standalone_serves_on_loopback_and_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _STANDALONE_CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        service_url, admin_url, jvm = json.loads(parent.stdout.readline())
        assert service_url.startswith("pulsar://127.0.0.1:")
        assert httpx.get(f"{admin_url}/admin/v2/clusters", timeout=10).json() == ["standalone"]
        client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            reader = client.create_reader("round-trip", pulsar.MessageId.earliest)
            client.create_producer("round-trip").send(b"hello")
            assert reader.read_next(10_000).data() == b"hello"
        finally:
            client.close()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{jvm}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{jvm}").exists(), "the JVM outlived its parent"
    assert not accepts_connections(service_url)
    assert (tmp_path / "pulsar.log").exists()


def test_missing_jars_are_named_with_what_to_run(tmp_path: Path) -> None:
    standalone = ApachePulsarStandalone(tmp_path, classpath_file=tmp_path / "classpath.txt")
    with pytest.raises(
        ApachePulsarError, match=r"classpath.txt is missing\): run `make apache-pulsar`"
    ):
        standalone.start()
    gone = tmp_path / "m2" / "pulsar-broker-4.0.7.jar"
    with pytest.raises(
        ApachePulsarError, match=rf"{gone} is on Apache Pulsar's classpath but missing"
    ):
        ApachePulsarStandalone(tmp_path, classpath=str(gone)).start()


def test_missing_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ApachePulsarError, match=r"needs Java 17 or newer, and no `java` is on"):
        ApachePulsarStandalone(tmp_path).start()


def test_a_broker_that_fails_to_start_is_reported_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    empty = tmp_path / "lib"
    empty.mkdir()
    standalone = ApachePulsarStandalone(tmp_path / "data", classpath=f"{empty}{os.sep}*")
    with pytest.raises(ApachePulsarError) as failure:
        standalone.start()
    message = str(failure.value)
    assert "Apache Pulsar exited with code 1 while starting" in message
    assert "ClassNotFoundException: org.apache.pulsar.PulsarStandaloneStarter" in message
    assert not standalone.is_running()
    assert not list((tmp_path / "cache").glob("magnetar/*")), "a failed start left an archive"


def test_a_bad_log_level_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGNETAR_BROKER_LOG_LEVEL", "loud")
    with pytest.raises(ApachePulsarError, match=r"MAGNETAR_BROKER_LOG_LEVEL='loud' is not one of"):
        ApachePulsarStandalone(tmp_path).start()
