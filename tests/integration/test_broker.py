"""The embedded broker: a real pulsar-lite process on a free loopback port, metrics off."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pulsar
import pytest

from magnetar.broker import BrokerError, EmbeddedBroker, find_free_port

pytestmark = pytest.mark.timeout(60)


def listening() -> list[tuple[str, str]]:
    """(local address, process column) of every listening TCP socket, from ``ss``."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    output = subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    sockets = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            sockets.append((fields[3], " ".join(fields[5:])))
    return sockets


def broker_pid(port: int) -> str:
    """The ``pid=N`` that owns the socket listening on 127.0.0.1:``port``."""
    owners = [process for address, process in listening() if address == f"127.0.0.1:{port}"]
    assert len(owners) == 1, f"expected one listener on port {port}, got {owners}"
    assert "pulsar-lite" in owners[0]
    pid = owners[0].split("pid=")[1].split(",")[0]
    return f"pid={pid},"


def accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def round_trip(service_url: str, topic: str, payload: bytes) -> bytes:
    """Send ``payload`` to ``topic`` and read it back through a real pulsar-client."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe(
            topic, "test-sub", initial_position=pulsar.InitialPosition.Earliest
        )
        producer = client.create_producer(topic)
        producer.send(payload)
        message = consumer.receive(10_000)
        consumer.acknowledge(message)
        return bytes(message.data())
    finally:
        client.close()


def test_context_manager_starts_serves_and_stops(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "data")
    with broker as running:
        assert running is broker
        assert running.is_running()
        assert running.port is not None
        assert running.service_url == f"pulsar://127.0.0.1:{running.port}"
        assert accepts_connections("127.0.0.1", running.port)
        assert round_trip(running.service_url, "broker-test", b"hello broker") == b"hello broker"
        assert (tmp_path / "data" / "pulsar-lite.toml").is_file()
        assert running.log_path == tmp_path / "data" / "broker.log"
    assert not broker.is_running()
    assert not accepts_connections("127.0.0.1", broker.port)


def test_broker_stops_when_the_block_raises(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path)
    with pytest.raises(RuntimeError, match="inside"), broker:
        port = broker.port
        raise RuntimeError("inside")
    assert not broker.is_running()
    assert port is not None
    assert not accepts_connections("127.0.0.1", port)


def test_broker_listens_on_its_port_only_and_not_on_8080(tmp_path: Path) -> None:
    before_8080 = [s for s in listening() if s[0].endswith(":8080")]
    with EmbeddedBroker(tmp_path) as broker:
        assert broker.port is not None
        pid = broker_pid(broker.port)
        own = [address for address, process in listening() if pid in process]
        after_8080 = [s for s in listening() if s[0].endswith(":8080")]
    # pulsar-lite's default config serves metrics on 0.0.0.0:8080.
    assert own == [f"127.0.0.1:{broker.port}"]
    assert after_8080 == before_8080


def test_taken_port(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = EmbeddedBroker(tmp_path, port=port)

        with pytest.raises(BrokerError) as caught:
            broker.start()

    message = str(caught.value)
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert not broker.is_running()


def test_a_stopped_broker_starts_again_at_once_on_its_port(tmp_path: Path) -> None:
    """The connections it closed on its clients linger in TIME_WAIT for a minute; they do not
    hold the port (a restarted `magnetar standalone` keeps 6650), and the clients reconnect."""
    port = find_free_port()
    broker = EmbeddedBroker(tmp_path, port=port).start()
    client = pulsar.Client(
        broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        producer = client.create_producer("again")
        producer.send(b"before")
        broker.stop()
        broker.start()
        producer.send(b"after")
    finally:
        client.close()
        broker.stop()
    assert broker.port == port


def test_explicit_free_port(tmp_path: Path) -> None:
    port = find_free_port()
    with EmbeddedBroker(tmp_path, port=port) as broker:
        assert broker.service_url == f"pulsar://127.0.0.1:{port}"
        assert accepts_connections("127.0.0.1", port)


def test_unusable_data_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    data_dir = blocker / "data"
    broker = EmbeddedBroker(data_dir)

    with pytest.raises(BrokerError) as caught:
        broker.start()

    message = str(caught.value)
    assert f"cannot use {data_dir} as the broker's data directory" in message
    assert not broker.is_running()


def test_service_url_before_start(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="the broker has not been started"):
        _ = EmbeddedBroker(tmp_path).service_url


def test_stop_is_idempotent_and_safe_before_start(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path)
    broker.stop()
    broker.start()
    port = broker.port
    broker.stop()
    broker.stop()
    assert not broker.is_running()
    assert port is not None
    assert not accepts_connections("127.0.0.1", port)


def test_two_brokers_at_once(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "one") as one, EmbeddedBroker(tmp_path / "two") as two:
        assert one.port != two.port
        assert round_trip(one.service_url, "shared-name", b"to one") == b"to one"
        assert round_trip(two.service_url, "shared-name", b"to two") == b"to two"
        # Separate brokers keep separate data: the topic on `two` only has its own message.
        client = pulsar.Client(
            two.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        try:
            reader = client.create_reader("shared-name", pulsar.MessageId.earliest)
            assert bytes(reader.read_next(10_000).data()) == b"to two"
            assert not reader.has_message_available()
        finally:
            client.close()


_OWNER = """
import sys, time
from magnetar.broker import EmbeddedBroker
broker = EmbeddedBroker(sys.argv[1]).start()
print(broker.pid, flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_broker_dies_with_its_owner(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    pid = int(owner.stdout.readline())
    assert running(pid)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)


def test_a_restart_from_a_thread_that_ends_keeps_the_broker(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path) as broker:
        assert broker.port is not None
        before = broker.pid
        restarter = threading.Thread(target=broker.restart)
        restarter.start()
        restarter.join()
        time.sleep(0.5)  # the thread is gone; the broker it restarted must not follow it
        assert broker.pid != before and broker.is_running()
        assert accepts_connections("127.0.0.1", broker.port)
        assert broker.heals == []  # asked for, not a heal
