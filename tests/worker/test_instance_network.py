"""What an isolated instance reaches on the network, held by the kernel: this host only on
the broker's ports (and DNS and ``instance_host_ports``), no link-local address (the cloud's
metadata service), and no connection accepted; other uids, root's included, are not held."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from pydantic import ValidationError

from magnetar.worker.config import WorkerConfig
from magnetar.worker.instance_network import InstanceNetwork, broker_ports, remove_table
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import collect, produce, values
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
)

UIDS = range(480040, 480042)
SYSTEM_PYTHON = "/usr/bin/python3"
"""Run as an instance uid, which cannot reach an interpreter under /root (pyenv's here)."""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="rules and uids need root (CI runs as root)"
)
needs_system_python = pytest.mark.skipif(
    not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"runs {SYSTEM_PYTHON} as another uid"
)
needs_nft = pytest.mark.skipif(
    shutil.which("nft", path=f"{os.defpath}:/usr/sbin:/sbin") is None,
    reason="needs nft (make installs Debian's nftables where it runs as root)",
)


def test_the_broker_ports_come_from_its_service_url() -> None:
    assert broker_ports("pulsar://127.0.0.1:6650") == {6650}
    assert broker_ports("pulsar://a:6650,b:7650/") == {6650, 7650}
    assert broker_ports("pulsar+ssl://broker.example.com") == {6651}
    assert broker_ports("pulsar://[::1]") == {6650}


def test_the_rules_hold_the_uids_to_the_ports_given_and_dns() -> None:
    rules = InstanceNetwork(range(400000, 400010), frozenset({6650}), table="t").ruleset()
    assert "add element inet t uids { 400000-400009 }" in rules
    assert "add element inet t host_ports { 53, 6650 }" in rules


def _listener(host: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    listening = socket.socket(family)
    listening.bind((host, 0))
    listening.listen()
    return listening


@pytest.fixture
def network() -> Iterator[InstanceNetwork]:
    """A table of its own for ``UIDS``, whose one open port is the "broker" listening."""
    broker = _listener()
    rules = InstanceNetwork(
        UIDS, frozenset({broker.getsockname()[1]}), table=f"magnetar_test_{uuid.uuid4().hex[:8]}"
    )
    why = rules.apply()
    assert why is None, why
    try:
        yield rules
    finally:
        remove_table(rules.table)
        broker.close()


# Connects to each (host, port) of argv and prints what came of it, one line each.
CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        print("connected", flush=True)
    except OSError as error:
        print(type(error).__name__, flush=True)
"""


def _connect_as(uid: int | None, *targets: str) -> list[str]:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", CONNECT, *targets],
        user=uid, capture_output=True, text=True, timeout=60, cwd="/", check=True,
    )  # fmt: skip
    return done.stdout.split()


@needs_root
@needs_nft
@needs_system_python
def test_an_instance_uid_reaches_this_host_only_on_the_ports_it_is_given(
    network: InstanceNetwork,
) -> None:
    (broker_port,) = network.host_ports
    other = _listener()
    other6 = _listener("::1", socket.AF_INET6)
    targets = [
        f"127.0.0.1:{broker_port}",
        f"127.0.0.1:{other.getsockname()[1]}",
        f"[::1]:{other6.getsockname()[1]}",
        "169.254.169.254:80",
    ]
    try:
        held = _connect_as(UIDS.start, *targets)
        assert held[0] == "connected"
        # refused at once by the kernel (a timeout would say TimeoutError)
        assert held[1:] == ["OSError", "PermissionError", "OSError"], held
        # root is not held (nor any uid outside the range)
        assert _connect_as(None, *targets[:3]) == ["connected"] * 3
    finally:
        other.close()
        other6.close()


# Listens as an instance uid, and prints what it accepted within 3 s.
LISTEN = """
import socket, sys
listening = socket.socket()
listening.bind(("127.0.0.1", 0))
listening.listen()
listening.settimeout(3)
print(listening.getsockname()[1], flush=True)
try:
    accepted, _ = listening.accept()
    print("accepted", accepted.recv(100), flush=True)
except OSError as error:
    print(type(error).__name__, flush=True)
"""


@needs_root
@needs_nft
@needs_system_python
def test_an_instance_uid_accepts_no_connection(network: InstanceNetwork) -> None:
    squatter = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", LISTEN], user=UIDS.start, stdout=subprocess.PIPE, text=True, cwd="/"
    )
    assert squatter.stdout is not None
    port = int(squatter.stdout.readline())
    with pytest.raises(TimeoutError):  # the handshake is never answered
        socket.create_connection(("127.0.0.1", port), timeout=1).sendall(b"Bearer a-token")
    assert squatter.stdout.read().split() == ["TimeoutError"]
    squatter.wait(10)


# Tries the worker's REST API on this host, and the cloud's metadata service.
PROBE = """
import socket


def process(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        return f"{target} connected"
    except OSError as error:
        return f"{target} {type(error).__name__}"
"""


@needs_root
@needs_nft
def test_an_isolated_function_reaches_the_broker_but_not_the_host_s_other_services(
    tmp_path: Path,
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
) -> None:
    rules = InstanceNetwork(
        UIDS, frozenset(broker_ports(broker_url)), table=f"magnetar_test_{uuid.uuid4().hex[:8]}"
    )
    assert rules.apply() is None
    api = _listener()  # where a worker's REST API would be
    try:
        code = tmp_path / "probe.py"
        code.write_text(PROBE)
        isolation = isolation_in(tmp_path, UIDS)
        config = function_config(py=str(code), inputs=[topic], output=f"{topic}-out")
        manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, isolation=isolation))
        manager.apply(instance_specs(config))
        targets = [f"127.0.0.1:{api.getsockname()[1]}", "169.254.169.254:80"]
        produce(client, topic, targets)

        # its inputs came and its outputs went: the broker is reached
        answers = sorted(values(collect(client, f"{topic}-out", 2)))
        assert answers == sorted(f"{target} OSError" for target in targets), answers
    finally:
        api.close()
        remove_table(rules.table)


def test_instance_host_ports_come_comma_separated_and_a_port_out_of_range_is_refused() -> None:
    assert WorkerConfig(instance_host_ports="8125, 9000").instance_host_ports == (8125, 9000)
    # nft would refuse the rules, and the worker would run its instances unheld
    with pytest.raises(ValidationError, match="instance_host_ports"):
        WorkerConfig(instance_host_ports="70000")
