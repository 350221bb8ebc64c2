"""CPU limits: an instance process is held to its ``resources.cpu`` by a cgroup quota, from
before its function loads until it exits, and its user code cannot leave the group; and the
worker's cgroup is found from what ``/proc`` says, on cgroup v1, v2 and in a container (a
guest on cgroup v2 runs some of these tests too: ``test_cgroup_v2``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pulsar
import pytest

from magnetar.worker.cgroups import Cgroup, find_cgroup
from magnetar.worker.cpu_limits import CpuLimits, open_cpu_limits
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import collect, produce, values, wait_for
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
)

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_CGROUPS = "3:cpuset:/\n2:cpu,cpuacct:/system.slice/magnetar.service\n0::/\n"


def test_the_workers_cgroup_is_found_on_v1_with_cpu_and_cpuacct_together() -> None:
    assert find_cgroup("cpu", V1_MOUNTS, V1_CGROUPS) == Cgroup(
        Path("/sys/fs/cgroup/cpu,cpuacct/system.slice/magnetar.service"), 1
    )


def test_in_a_container_the_mounted_root_is_the_containers_cgroup() -> None:
    mounts = "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    assert find_cgroup("cpu", mounts, "2:cpu:/docker/abc\n") == Cgroup(
        Path("/sys/fs/cgroup/cpu"), 1
    )
    assert find_cgroup("cpu", mounts, "2:cpu:/other\n") == (
        "the worker's cgroup /other is outside the mounted hierarchy (/docker/abc)"
    )


def test_on_v2_the_cpu_controller_must_be_offered(tmp_path: Path) -> None:
    group = tmp_path / "workers"
    group.mkdir()
    mounts = f"30 1 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    (group / "cgroup.controllers").write_text("memory pids\n")
    assert find_cgroup("cpu", mounts, "0::/workers\n") == (
        f"cgroup v2 at {group} offers no cpu controller"
    )
    (group / "cgroup.controllers").write_text("cpu memory pids\n")
    assert find_cgroup("cpu", mounts, "0::/workers\n") == Cgroup(group, 2)
    # where a worker moved what ran in its cgroup (see test_cgroup_v2), its cgroup stays that
    assert find_cgroup("cpu", mounts, "0::/workers/magnetar-worker\n") == Cgroup(group, 2)


def test_without_a_cpu_hierarchy_the_reason_says_so() -> None:
    assert (
        find_cgroup("cpu", "", "0::/\n") == "no cgroup hierarchy with the cpu controller is mounted"
    )


SPIN = """\
import time


def process(input):
    ends = time.monotonic() + 3
    while time.monotonic() < ends:
        pass
    return input
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def cpu_limits() -> CpuLimits:
    limits = open_cpu_limits()
    if limits is None:
        pytest.skip("CPU limits need root and a cgroup cpu controller (CI runs as root)")
    return limits


def test_spinning_user_code_gets_its_resources_cpu_and_no_more(
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    tmp_path: Path,
    cpu_limits: CpuLimits,
) -> None:
    code = tmp_path / "spin.py"
    code.write_text(SPIN)
    config = function_config(py=str(code), inputs=[topic], resources={"cpu": 0.25})
    (key,) = specs = instance_specs(config)
    manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, cpu_limits=cpu_limits))
    manager.apply(specs)
    wait_for(lambda: manager.pid(key) is not None)
    pid = manager.pid(key)
    assert pid is not None
    groups = [g for g in cpu_limits.root.iterdir() if g.name.endswith(f"-{pid}")]
    assert len(groups) == 1 and (groups[0] / "cgroup.procs").read_text().split() == [str(pid)]

    before = _cpu_seconds(pid)
    produce(client, topic, ["spin"])  # 3 s of spinning, by the clock
    wait_for(lambda: key in manager.statuses() and manager.statuses()[key].processed == 1)
    used = (_cpu_seconds(pid) - before) / 3
    assert 0.1 < used < 0.35, f"the instance used {used:.2f} cores, limited to 0.25"

    manager.apply({})
    wait_for(lambda: not groups[0].exists(), timeout=20)  # removed once the process exited


def test_a_limit_past_the_hosts_cores_is_no_limit_and_the_group_goes_with_its_process(
    cpu_limits: CpuLimits,
) -> None:
    def quota(group: Path) -> str:
        if cpu_limits.version == 1:
            return (group / "cpu.cfs_quota_us").read_text().strip()
        return (group / "cpu.max").read_text().split()[0]

    def weight(group: Path) -> float:
        name = "cpu.shares" if cpu_limits.version == 1 else "cpu.weight"
        per_core = 1024 if cpu_limits.version == 1 else 100
        return int((group / name).read_text()) / per_core

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        cpu_limits.limit(sleeper.pid, 0.5)
        (group,) = [g for g in cpu_limits.root.iterdir() if g.name.endswith(f"-{sleeper.pid}")]
        assert quota(group) == "50000"
        assert weight(group) == 0.5  # among instances, as resources.cpu
        cpu_limits.limit(sleeper.pid, 1e12)  # resources.cpu is any positive number
        assert quota(group) in ("-1", "max")
        cpu_limits.limit(sleeper.pid, 1e-300)
        assert quota(group) == "1000"  # the kernel's least: 1 ms a period
    finally:
        sleeper.kill()
        sleeper.wait()
    cpu_limits.release(sleeper.pid)
    assert not group.exists()


ESCAPE = """
import errno
import os


def process(input):
    moved = []
    for target in input.split(","):  # the hierarchy's root, and the instances' group
        try:
            with open(os.path.join(target, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
            moved.append("moved")
        except OSError as error:
            moved.append(errno.errorcode[error.errno])
    return " ".join(moved)
"""


def test_user_code_cannot_leave_its_group(
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    tmp_path: Path,
    cpu_limits: CpuLimits,
) -> None:
    code = tmp_path / "escape.py"
    code.write_text(ESCAPE)
    isolation = isolation_in(tmp_path, range(480010, 480012))
    config = function_config(py=str(code), inputs=[topic], output=f"{topic}-out")
    (key,) = specs = instance_specs(config)
    runtime = ProcessRuntime(broker_url, WORKER_ID, isolation=isolation, cpu_limits=cpu_limits)
    manager = start_manager(runtime)
    manager.apply(specs)
    produce(client, topic, [f"{cpu_limits.root.parent},{cpu_limits.root}"])

    (answer,) = values(collect(client, f"{topic}-out", 1))
    # EACCES: not its file; EROFS: in its own view of the files, read-only to begin with
    assert answer in {"EACCES EACCES", "EROFS EROFS"}, answer
    pid = manager.pid(key)
    (group,) = [g for g in cpu_limits.root.iterdir() if g.name.endswith(f"-{pid}")]
    assert (group / "cgroup.procs").read_text().split() == [str(pid)]
