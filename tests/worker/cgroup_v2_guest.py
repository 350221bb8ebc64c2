"""Tests that run only in a guest on cgroup v2 (``test_cgroup_v2`` boots it and runs them
there): where a worker is in the cgroup hierarchy, and what its instances' limits become.

Each starts a worker's part of its own, ``WORKER``, which waits until the test has put it in
a cgroup, then opens the worker's CPU and memory limits as a starting worker does and holds a
child to 64 MiB (the kernel's limit 128 MiB), which then asks for 1 GiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

CGROUPS = Path("/sys/fs/cgroup")

WORKER = """
import json, subprocess, sys
from magnetar.worker.cgroups import open_groups
from magnetar.worker.cpu_limits import CpuLimits
from magnetar.worker.memory_limits import MemoryLimits

sys.stdin.readline()  # put in its cgroup by now
said = {}
for kind in (MemoryLimits, CpuLimits):
    limits = open_groups(kind)
    said[kind.controller] = limits if isinstance(limits, str) else str(limits.root)
if not isinstance(limits, str):
    hog = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(1); held = b'x' * 1024 ** 3"],
        stdin=subprocess.PIPE,
    )
    memory = open_groups(MemoryLimits)
    memory.limit(hog.pid, 64 * 1024 * 1024)
    limits.limit(hog.pid, 0.5)
    hog.stdin.write(b"go")
    hog.stdin.close()
    said["hog"] = hog.wait(60)
    said["oom_kills"] = memory.oom_kills(hog.pid)
said["cgroup"] = open("/proc/self/cgroup").read().strip()
print(json.dumps(said), flush=True)
"""


def _run_worker_in(cgroup: Path) -> dict[str, object]:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    (cgroup / "cgroup.procs").write_text(str(worker.pid))
    out, _ = worker.communicate(b"go\n", timeout=300)
    assert worker.returncode == 0
    said: dict[str, object] = json.loads(out)
    return said


@pytest.fixture
def controllers() -> None:
    """The CPU and memory controllers enabled below the root, as systemd does."""
    (CGROUPS / "cgroup.subtree_control").write_text("+cpu +memory")


@pytest.fixture
def service(controllers: None) -> Path:
    """A cgroup as systemd makes a service's: the controllers enabled down to it, none below."""
    slice_ = CGROUPS / "test.slice"
    slice_.mkdir(exist_ok=True)
    (slice_ / "cgroup.subtree_control").write_text("+cpu +memory")
    group = slice_ / f"magnetar-{uuid.uuid4().hex[:6]}.service"
    group.mkdir()
    return group


def _in(group: Path) -> list[str]:
    return (group / "cgroup.procs").read_text().split()


def test_a_worker_alone_in_its_cgroup_moves_into_a_group_of_its_own_and_limits_instances(
    service: Path,
) -> None:
    said = _run_worker_in(service)
    assert said["memory"] == said["cpu"] == str(service / "magnetar-instances")
    assert said["cgroup"] == f"0::/test.slice/{service.name}/magnetar-worker"
    assert said["hog"] == -9 and said["oom_kills"] == 1  # killed by the kernel at 128 MiB
    # a worker started again where the last one moved (a restarted process of the service)
    again = _run_worker_in(service / "magnetar-worker")
    assert again["memory"] == again["cpu"] == str(service / "magnetar-instances")
    assert again["hog"] == -9


def test_a_worker_sharing_its_cgroup_with_another_program_limits_nothing_and_says_why(
    service: Path,
) -> None:
    other = subprocess.Popen(["sleep", "300"])
    try:
        (service / "cgroup.procs").write_text(str(other.pid))
        said = _run_worker_in(service)
        for controller in ("memory", "cpu"):
            why = str(said[controller])
            assert f"holds processes that are not the worker's (sleep {other.pid})" in why, why
            assert "Delegate=yes" in why
        assert _in(service) == [str(other.pid)]  # the other program was left where it was
        assert "hog" not in said
    finally:
        other.kill()
        other.wait()


@pytest.mark.usefixtures("controllers")
def test_a_worker_in_the_root_cgroup_leaves_the_processes_there() -> None:
    other = subprocess.Popen(["sleep", "300"])
    try:
        (CGROUPS / "cgroup.procs").write_text(str(other.pid))
        said = _run_worker_in(CGROUPS)
        assert said["memory"] == said["cpu"] == str(CGROUPS / "magnetar-instances")
        assert said["cgroup"] == "0::/"
        assert str(other.pid) in _in(CGROUPS)
        assert said["hog"] == -9
    finally:
        other.kill()
        other.wait()
