"""Memory limits with what an instance starts: the memory of its children is counted against
its ``resources.ram`` (and the instance stopped over it, saying so), and the kernel holds its
cgroup to a hard limit a quarter above it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pulsar
import pytest

from magnetar.worker.isolation import _real_uid
from magnetar.worker.memory_limits import MemoryLimits, hard_limit, open_memory_limits
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import produce, wait_for
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
    system_exceptions,
)

MIB = 1024 * 1024
UIDS = range(480020, 480022)

# a child holding 300 MiB: over the function's 256, under the kernel's 320
PARENT = """
import subprocess
import sys

HOLD = "import time; held = b'x' * (300 * 1024 * 1024); print('held', flush=True); time.sleep(120)"


def process(input):
    child = subprocess.Popen([sys.executable, "-c", HOLD])
    return str(child.wait())
"""


@pytest.fixture
def memory_limits() -> MemoryLimits:
    limits = open_memory_limits()
    if limits is None:
        pytest.skip("memory limits need root and a cgroup memory controller (CI runs as root)")
    return limits


def test_the_memory_of_what_an_instance_starts_counts_against_its_resources_ram(
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    tmp_path: Path,
    memory_limits: MemoryLimits,
) -> None:
    code = tmp_path / "parent.py"
    code.write_text(PARENT)
    isolation = isolation_in(tmp_path, UIDS)
    ram = 256 * MIB
    config = function_config(py=str(code), inputs=[topic], resources={"ram": ram})
    (key,) = specs = instance_specs(config)
    runtime = ProcessRuntime(
        broker_url, WORKER_ID, isolation=isolation, memory_limits=memory_limits
    )
    manager = start_manager(runtime, liveness_interval_s=0.2)
    manager.apply(specs)
    wait_for(lambda: manager.pid(key) is not None)
    pid = manager.pid(key)
    assert pid is not None
    wait_for(lambda: _real_uid(str(pid)) in UIDS)  # it dropped to its user
    uid = _real_uid(str(pid))
    (group,) = [g for g in memory_limits.root.iterdir() if g.name.endswith(f"-{pid}")]
    limit_file = "memory.limit_in_bytes" if memory_limits.version == 1 else "memory.max"
    assert int((group / limit_file).read_text()) == hard_limit(ram) == 320 * MIB

    produce(client, topic, ["start a child"])

    wait_for(lambda: bool(system_exceptions(manager, key, "out of memory")), timeout=30)
    said = system_exceptions(manager, key, "out of memory")[0]
    assert said.startswith(f"out of memory: over resources.ram {ram} bytes (it held "), said
    held = int(said.split("(it held ")[1].split()[0])
    assert ram < held < hard_limit(ram), said  # the child's, counted
    manager.apply({})
    # the child went with the instance, and so did its group
    # (the stop waits for user code up to instance_stop_timeout_s: the child is waited on)
    wait_for(lambda: not _processes_of(uid), timeout=40)
    wait_for(lambda: not group.exists(), timeout=20)


def test_the_kernel_holds_an_instances_group_to_its_hard_limit(
    memory_limits: MemoryLimits,
) -> None:
    hog = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(1); held = b'x' * (1024 ** 3)"],
        stdin=subprocess.PIPE,
    )
    try:
        memory_limits.limit(hog.pid, 64 * MIB)  # held to 128 MiB
        assert hog.stdin is not None
        hog.stdin.write(b"go")
        hog.stdin.close()
        assert hog.wait(30) == -9  # killed by the kernel at its limit
        assert memory_limits.oom_kills(hog.pid) == 1
    finally:
        hog.kill()
        hog.wait()
    memory_limits.release(hog.pid)
    assert not memory_limits.group(hog.pid).exists()


def test_the_hard_limit_is_a_quarter_above_resources_ram_and_at_least_64_mib_above() -> None:
    assert hard_limit(1024 * MIB) == 1280 * MIB
    assert hard_limit(128 * MIB) == 192 * MIB


def _processes_of(uid: int) -> list[str]:
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and _real_uid(pid) == uid]
