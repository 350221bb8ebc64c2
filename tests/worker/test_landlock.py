"""Abstract Unix sockets and signals scoped to an isolated instance's own processes
(``magnetar.instance.landlock``): the worker's and the host's abstract sockets are out of an
instance's reach, its own are not."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance.landlock import scope_to_own, scopes_unavailable
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import collect, produce, values
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
)

UIDS = range(480050, 480052)

needs_scopes = pytest.mark.skipif(
    scopes_unavailable() is not None, reason=f"no Landlock scopes: {scopes_unavailable()}"
)


@pytest.fixture
def abstract_listener() -> Iterator[bytes]:
    """An abstract socket of this process, as a worker or a host service would have."""
    name = f"\0magnetar-test-{uuid.uuid4().hex}".encode()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(name)
    listener.listen()
    yield name
    listener.close()


# Run by an isolated instance as its function, and by the test's own scoped child process.
PROBE = """
import socket, uuid


def connects(name):
    with socket.socket(socket.AF_UNIX) as client:
        try:
            client.connect(name)
        except OSError as error:
            return type(error).__name__
    return "connected"


def process(name):
    own = ("\\0own-" + uuid.uuid4().hex).encode()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(own)
        listener.listen()
        workers = connects(b"\\0" + name.encode())
        return f"worker's: {workers}, own: {connects(own)}"
"""


@needs_scopes
def test_a_scoped_process_reaches_its_own_abstract_sockets_and_signals_only(
    abstract_listener: bytes,
) -> None:
    probe: dict[str, Any] = {}
    exec(PROBE, probe)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports in one line, then exits
        said = ""
        try:
            scope_to_own()
            said = probe["process"](abstract_listener[1:].decode())
            os.kill(os.getppid(), 0)
            said += ", signalled"
        except OSError as error:
            said += f", {type(error).__name__}"
        finally:
            os.write(write, said.encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as report:
        said = report.read()
    os.waitpid(child, 0)
    assert said == "worker's: PermissionError, own: connected, PermissionError"
    assert probe["connects"](abstract_listener) == "connected"  # out of scope, others still may


@needs_scopes
@pytest.mark.skipif(os.geteuid() != 0, reason="isolated instances need a root worker")
def test_an_isolated_function_cannot_connect_to_the_workers_abstract_sockets(
    tmp_path: Path,
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    abstract_listener: bytes,
) -> None:
    code = tmp_path / "probe.py"
    code.write_text(PROBE)
    config = function_config(py=str(code), inputs=[topic], output=f"{topic}-out")
    runtime = ProcessRuntime(broker_url, WORKER_ID, isolation=isolation_in(tmp_path, UIDS))
    start_manager(runtime).apply(instance_specs(config))
    produce(client, topic, [abstract_listener[1:].decode()])

    assert values(collect(client, f"{topic}-out", 1)) == [
        "worker's: PermissionError, own: connected"
    ]
