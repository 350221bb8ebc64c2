"""Instance users and directories on a root worker: a uid is never shared by two running
instances (on one host), and one that comes back to a uid cannot read what the uid's
previous holder kept, nor meet a process it left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from magnetar.worker.isolation import InstanceIsolation

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing out uids needs root (CI runs as root)"
)

UIDS = range(480000, 480002)


def _isolation(tmp_path: Path, worker: str) -> InstanceIsolation:
    tmp_path.chmod(0o711)
    return InstanceIsolation(tmp_path / worker, UIDS, locks=tmp_path / "locks")


def test_two_workers_on_a_host_never_hand_out_the_same_uid(tmp_path: Path) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    first, second = _isolation(tmp_path, "w1"), _isolation(tmp_path, "w2")

    a = first.claim("public/default/f", 0, package)
    b = second.claim("public/default/f", 0, package)

    assert {a.uid, b.uid} == set(UIDS)
    assert (a.work_dir / "package" / "f.py").read_text() == package.read_text()
    assert (a.work_dir.stat().st_uid, a.work_dir.stat().st_mode & 0o777) == (a.uid, 0o700)
    with pytest.raises(
        RuntimeError, match=r"every uid of instance_uids \(480000-480001\) is taken"
    ):
        first.claim("public/default/g", 0, package)


def test_the_next_holder_of_a_uid_finds_nothing_of_the_previous_one(tmp_path: Path) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    isolation = _isolation(tmp_path, "w1")
    first = isolation.claim("acme/prod/f", 0, package)
    # user code that left a process behind, running as its uid
    leftover = subprocess.Popen(["sleep", "60"], user=first.uid, group=first.gid)

    isolation.release(first.uid)

    assert leftover.wait(5) == -9
    assert first.work_dir.stat().st_uid == 0  # the worker's again
    second = isolation.claim("public/default/g", 0, package)
    assert second.uid == first.uid  # the uid comes back ...
    assert first.work_dir.stat().st_uid == 0  # ... without the previous holder's directory
    assert second.work_dir.stat().st_uid == second.uid
    isolation.release(second.uid)


def test_a_restarted_worker_takes_back_what_it_left_to_instance_uids(tmp_path: Path) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    user = _isolation(tmp_path, "w1").claim("acme/prod/f", 0, package)  # never released

    _isolation(tmp_path, "w1")  # the worker starts again

    assert user.work_dir.stat().st_uid == 0
