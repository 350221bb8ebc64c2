"""Instance users and directories on a root worker: a uid is never shared by two running
instances (on one host), and one that comes back to a uid cannot read what the uid's
previous holder kept, nor meet a process it left behind; what an instance writes where every
user may (/tmp, /dev/shm, System V IPC) is its own and goes with it; and a fork bomb in user
code stops at the instance's task limit."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.worker.isolation import _real_uid
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import collect, produce, values, wait_for
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
    pid_exists,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing out uids needs root (CI runs as root)"
)

UIDS = range(480000, 480002)


def test_two_workers_on_a_host_never_hand_out_the_same_uid(tmp_path: Path) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    first, second = isolation_in(tmp_path, UIDS, "w1"), isolation_in(tmp_path, UIDS, "w2")

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
    isolation = isolation_in(tmp_path, UIDS, "w1")
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


def test_an_instances_temp_folder_starts_empty_each_run(tmp_path: Path) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    isolation = isolation_in(tmp_path, UIDS, "w1")
    first = isolation.claim("acme/prod/f", 0, package)
    (first.work_dir / "tmp" / "big").write_bytes(bytes(1000))
    (first.work_dir / "kept").write_text("state")
    isolation.release(first.uid)
    again = isolation.claim("acme/prod/f", 0, package)
    assert list((again.work_dir / "tmp").iterdir()) == []  # TMPDIR: nothing of the last run
    assert (again.work_dir / "kept").read_text() == "state"  # the rest of its directory stays
    isolation.release(again.uid)
    # a link planted where the temp folder was is removed, not followed
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("x")
    shutil.rmtree(again.work_dir / "tmp")
    (again.work_dir / "tmp").symlink_to(target)
    third = isolation.claim("acme/prod/f", 0, package)
    assert (third.work_dir / "tmp").is_dir() and not (third.work_dir / "tmp").is_symlink()
    assert (target / "precious").read_text() == "x"
    isolation.release(third.uid)


def test_a_restarted_worker_takes_back_what_it_left_to_instance_uids(tmp_path: Path) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    user = isolation_in(tmp_path, UIDS, "w1").claim("acme/prod/f", 0, package)  # never released

    isolation_in(tmp_path, UIDS, "w1")  # the worker starts again

    assert user.work_dir.stat().st_uid == 0


# A worker that claims a uid for an instance, which forks a process into a session of its
# own, and is killed (nothing released); prints that process's pid.
KILLED_WORKER = """
import os, subprocess, sys
from pathlib import Path
from magnetar.worker.isolation import InstanceIsolation

root, locks, package = map(Path, sys.argv[1:4])
user = InstanceIsolation(root, range(480000, 480002), locks=locks).claim("acme/prod/f", 0, package)
left = subprocess.Popen(
    ["sleep", "120"], user=user.uid, group=user.gid, start_new_session=True, cwd="/",
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(left.pid, flush=True)
os._exit(0)
"""


def test_a_restarted_worker_kills_what_its_killed_instances_left_running(
    tmp_path: Path,
) -> None:
    package = tmp_path / "f.py"
    package.write_text("def process(input):\n    return input\n")
    tmp_path.chmod(0o711)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WORKER, tmp_path / "w1", tmp_path / "locks", package],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    left = int(killed.stdout)
    assert pid_exists(left), "the instance's process did not outlive its worker"
    try:
        isolation_in(tmp_path, UIDS, "w1")  # the worker starts again

        wait_for(lambda: not pid_exists(left), 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(left, signal.SIGKILL)


FORKER = """
import subprocess


def process(input):
    children = []
    try:
        for _ in range(300):
            children.append(subprocess.Popen(["sleep", "120"]))
    except OSError as error:
        return f"{len(children)} {type(error).__name__}"
    return f"{len(children)} none"
"""


def test_a_fork_bomb_stops_at_the_instances_task_limit(
    tmp_path: Path,
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
) -> None:
    code = tmp_path / "forker.py"
    code.write_text(FORKER)
    isolation = isolation_in(tmp_path, UIDS, max_tasks=64)
    config = function_config(py=str(code), inputs=[topic], output=f"{topic}-out")
    (key,) = specs = instance_specs(config)
    manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, isolation=isolation))
    manager.apply(specs)
    produce(client, topic, ["go"])

    (answer,) = values(collect(client, f"{topic}-out", 1))
    spawned, error = answer.split()
    assert error == "BlockingIOError" and 0 < int(spawned) < 64, answer  # EAGAIN from fork
    uid = _real_uid(str(manager.pid(key)))
    assert uid is not None and uid in UIDS
    assert len(_processes_of(uid)) <= 64
    manager.apply({})  # stopped: what it left running goes with it
    wait_for(lambda: not _processes_of(uid), timeout=20)


def _processes_of(uid: int) -> list[str]:
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and _real_uid(pid) == uid]


SNOOP = """
import ctypes
import multiprocessing
import os

SHARED = {shared!r}


def uid_of(pid):
    try:
        with open(f"/proc/{{pid}}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    except FileNotFoundError:  # gone meanwhile
        return os.getuid()


def process(input):
    seen = []
    for directory in ("/tmp", "/var/tmp", "/dev/shm", SHARED):
        try:
            with open(os.path.join(directory, "left-by-" + input), "w") as file:
                file.write("secret")
            seen.append("wrote")
        except OSError as error:
            seen.append(f"errno{{error.errno}}")
    try:
        with open("/dev/shm/fill", "wb") as file:
            for _ in range(300):
                file.write(bytes(1 << 20))
        seen.append("filled")
    except OSError as error:
        seen.append(f"errno{{error.errno}}")
    finally:
        os.remove("/dev/shm/fill")
    multiprocessing.Lock()  # POSIX semaphores live in its /dev/shm
    others = [p for p in os.listdir("/proc") if p.isdigit() and uid_of(p) != os.getuid()]
    seen.append(f"sees {{len(others)}} others" if others else "alone")
    segment = ctypes.CDLL(None).shmget(0x4D41474E, 1 << 20, 0o1000 | 0o600)
    seen.append("segment" if segment >= 0 else "no-segment")
    return " ".join(seen)
"""


@pytest.fixture
def shared_directory() -> Iterator[Path]:
    """A directory every user may write, outside the temp directories."""
    path = Path("/var") / f"magnetar-test-shared-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o1777)
    path.chmod(0o1777)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=True)


def test_what_an_instance_writes_where_every_user_may_is_its_own_and_goes_with_it(
    tmp_path: Path,
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    shared_directory: Path,
) -> None:
    code = tmp_path / "snoop.py"
    code.write_text(SNOOP.format(shared=str(shared_directory)))
    isolation = isolation_in(tmp_path, UIDS, "w1")
    assert isolation.private, "this host lets a root worker give instances views of their own"
    config = function_config(
        py=str(code), inputs=[topic], output=f"{topic}-out", resources={"ram": 128 * 1024 * 1024}
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, isolation=isolation))
    manager.apply(specs)
    marker = uuid.uuid4().hex
    produce(client, topic, [marker])

    (answer,) = values(collect(client, f"{topic}-out", 1))
    # /tmp, /var/tmp and /dev/shm: written, in its own; anywhere else: a read-only file
    # system (30); its /tmp, /var/tmp and /dev/shm hold 128 MiB together: no space (28);
    # /proc shows it alone
    assert answer == "wrote wrote wrote errno30 errno28 alone segment", answer
    uid = _real_uid(str(manager.pid(key)))
    host = ["/tmp", "/var/tmp", "/dev/shm", str(shared_directory)]
    assert not [d for d in host if os.path.exists(os.path.join(d, f"left-by-{marker}"))]
    assert f"{0x4D41474E:10d}" not in Path("/proc/sysvipc/shm").read_text()
    manager.apply({})  # stopped: what it wrote in its own /tmp goes with it
    wait_for(lambda: uid is not None and not _processes_of(uid), timeout=20)
    assert not [d for d in host if os.path.exists(os.path.join(d, f"left-by-{marker}"))]
