"""Shared fixtures: one real pulsar-lite broker per test session, clients, unique topics."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """The embedded broker, on a free loopback port with a temporary data directory."""
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running


@pytest.fixture(scope="session")
def broker_url(broker: EmbeddedBroker) -> str:
    return broker.service_url


@pytest.fixture(scope="session")
def client(broker_url: str) -> Iterator[pulsar.Client]:
    """A pulsar-client connected to the session broker (quiet unless something is wrong)."""
    c = pulsar.Client(
        broker_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        operation_timeout_seconds=10,
    )
    yield c
    c.close()


@pytest.fixture
def topic() -> str:
    """A fresh topic name; each call site adds a suffix for more topics."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cli_env(broker_url: str) -> dict[str, str]:
    """Environment for running the `magnetar` CLI in a subprocess against the broker."""
    env = dict(os.environ)
    env["MAGNETAR_BROKER_URL"] = broker_url
    env["PYTHONUNBUFFERED"] = "1"
    return env


MAGNETAR = [sys.executable, "-m", "magnetar.cli"]


def descendants_named(ancestor: int, name: str) -> list[int]:
    """Pids of the processes below ``ancestor`` (children, grandchildren...) whose name, as
    ``ps`` shows it (/proc/<pid>/comm), is ``name``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        comm, rest = stat.split(" (", 1)[1].rsplit(") ", 1)
        names[int(entry.name)], parents[int(entry.name)] = comm, int(rest.split()[1])

    def descends(pid: int) -> bool:
        seen = 0
        while pid in parents and seen < 64:
            pid, seen = parents[pid], seen + 1
            if pid == ancestor:
                return True
        return False

    return sorted(pid for pid, comm in names.items() if comm == name and descends(pid))


def instance_pids(parent: int) -> list[int]:
    """The instance processes a localrun (process ``parent``) started."""
    children = subprocess.run(
        ["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [
        int(pid) for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
