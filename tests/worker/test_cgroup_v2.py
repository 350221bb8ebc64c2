"""CPU and memory limits on cgroup v2, in a guest (``tests.guest_vm``): this machine's
controllers are all on v1.

The guest puts pytest in a cgroup as systemd puts a service's processes, and runs there the
tests of ``cgroup_v2_guest`` and those of the limits' tests that need no broker.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.guest_vm import ROOT, guest_unavailable, run_in_guest

GUEST_TESTS = (
    "tests/worker/test_memory_limits.py::"
    "test_the_kernel_holds_an_instances_group_to_its_hard_limit",
    "tests/worker/test_cpu_limits.py::"
    "test_a_limit_past_the_hosts_cores_is_no_limit_and_the_group_goes_with_its_process",
    "tests/worker/cgroup_v2_guest.py::"
    "test_a_worker_alone_in_its_cgroup_moves_into_a_group_of_its_own_and_limits_instances",
    "tests/worker/cgroup_v2_guest.py::"
    "test_a_worker_sharing_its_cgroup_with_another_program_limits_nothing_and_says_why",
    "tests/worker/cgroup_v2_guest.py::test_a_worker_in_the_root_cgroup_leaves_the_processes_there",
)

SCRIPT = """
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+cpu +memory" > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/system.slice /sys/fs/cgroup/system.slice/magnetar.service
echo "+cpu +memory" > /sys/fs/cgroup/system.slice/cgroup.subtree_control
echo $$ > /sys/fs/cgroup/system.slice/magnetar.service/cgroup.procs
cd {root}
export HOME=/run/tmp PYTHONDONTWRITEBYTECODE=1
exec {python} -m pytest -p no:cacheprovider --color=no -q -rA {tests}
"""


@pytest.mark.timeout(900)
def test_instances_are_held_to_their_limits_on_cgroup_v2_from_a_service_cgroup(
    tmp_path: Path,
) -> None:
    why = guest_unavailable()
    if why is not None:
        pytest.skip(f"no guest to run cgroup v2 in: {why}")
    script = SCRIPT.format(
        root=ROOT, python=ROOT / ".venv" / "bin" / "python", tests=" ".join(GUEST_TESTS)
    )
    console = run_in_guest(script, tmp_path, timeout_s=840)
    outcomes = dict(
        (name, outcome)
        for outcome, name in re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED\S*) (\S+)", console, re.M)
    )
    said = "\n".join(line for line in console.splitlines() if not line.startswith("["))
    assert outcomes == dict.fromkeys(GUEST_TESTS, "PASSED"), said[-8000:]
