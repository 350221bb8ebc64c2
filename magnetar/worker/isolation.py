"""Instance isolation on a worker that runs as root: an OS user and a directory per instance.

Each running instance gets a uid (and the gid of the same number) of its own from
``instance_uids``, none of them with a passwd entry. A uid per *instance* rather than per
tenant: two instances never share a user, so none can read another's directory, signal it or
read its ``/proc`` files, whichever tenants they belong to (a per-tenant user would let one
function of a tenant read the state and credentials of the tenant's other functions, which
another role may have submitted). The uid is claimed host-wide with a lock file, so several
workers on one host (``magnetar standalone``) never hand out the same one.

An instance's directory, ``<instance_dir>/<fqfn>/<instance id>`` (mode 0700), holds a copy
of its code package, what the package installs, its state database and its temporary
files. It is owned by the instance's uid while the instance runs and by root otherwise (and
what still runs as that uid is killed), so whoever gets the uid next can neither read it
nor meet a process left behind. A worker killed before it could do so leaves its claims
unreleased: the next worker to start on the host does it for them. It is kept across
restarts (what was installed is found again) and removed with the function. The directories
above it are searchable but not readable (0711), so an instance reaches its own directory
and can list nobody's.

Where the host allows (``sandbox.probe``), each instance also gets a view of the files of its
own (``magnetar.instance.sandbox``): what every user may write (``/tmp``, ``/dev/shm``,
System V IPC) is the instance's alone and goes with it, so nothing it leaves there reaches
the next holder of its uid or holds the host's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO
from urllib.parse import quote, unquote

from magnetar.instance import sandbox
from magnetar.instance.privileges import InstanceUser
from magnetar.worker.exceptions import WorkerConfigError

__all__ = [
    "SCRIPT_CHECKS",
    "InstanceIsolation",
    "parse_uid_range",
    "readable_by_others",
    "secure_directory",
]

log = logging.getLogger(__name__)

SCRIPT_CHECKS = "script-checks"
"""What ``claim`` takes as the function of a script check's process (``script_check``): its
directories sit beside the functions' (a function's name always has slashes, quoted)."""
_LOCKS = Path(tempfile.gettempdir()) / "magnetar-instance-uids"
"""Where workers of this host claim uids (one lock file per uid, locked while it runs)."""


def parse_uid_range(text: str) -> range:
    """The uids of ``FIRST-LAST`` (``instance_uids``); ValueError says what is wrong."""
    first, _, last = text.partition("-")
    try:
        uids = range(int(first), int(last) + 1)
    except ValueError:
        raise ValueError(f"must be FIRST-LAST (such as 400000-465535), got {text!r}") from None
    if not 0 < uids.start < uids.stop <= 2**32 - 1:
        raise ValueError(f"must be uids above 0 with FIRST <= LAST, got {text!r}")
    return uids


def secure_directory(path: Path, mode: int = 0o700) -> None:
    """Create ``path`` if needed and make it ``mode`` (not world-readable). Refuses one that
    another user owns, or a symbolic link (in a shared temp dir, someone else's trap)."""
    path.mkdir(parents=True, exist_ok=True)
    found = path.lstat()
    if stat.S_ISLNK(found.st_mode) or found.st_uid != os.geteuid():
        raise WorkerConfigError(
            f"{path} belongs to another user (uid {found.st_uid}) or is a symbolic link: "
            "remove it, or choose another directory"
        )
    path.chmod(mode)


def readable_by_others(setting: str | None) -> Path | None:
    """The file a key setting names (``file:///path`` or a path) when users other than its
    owner may read it: an instance could then read it too."""
    if not setting or setting.startswith("data:"):
        return None
    path = Path(setting.removeprefix("file://"))
    try:
        return (
            path if path.is_file() and path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH) else None
        )
    except OSError:
        return None


class InstanceIsolation:
    """Hands out instance users and prepares their directories (see the module doc)."""

    def __init__(
        self, root: Path, uids: range, locks: Path = _LOCKS, max_tasks: int = 1024
    ) -> None:
        """``max_tasks``: the processes and threads each instance user may have at once."""
        self.root = root
        self.max_tasks = max_tasks
        self._uids = uids
        self._locks = locks
        self._lock = threading.Lock()
        self._claimed: dict[int, tuple[IO[str], Path]] = {}
        why = sandbox.probe()
        self.private = why is None
        """Whether instances get a view of the files of their own (``InstanceUser.private``)."""
        if why is not None:
            log.warning(
                "instances share /tmp, /var/tmp, /dev/shm and System V IPC with the host, and "
                "may write wherever every user may: a view of their own needs root with "
                "CAP_SYS_ADMIN and Linux 5.12 or later: %s",
                why,
            )
        secure_directory(root, 0o711)
        secure_directory(locks)
        self._revoke_abandoned()
        for work_dir in root.glob("*/*"):  # what a killed worker left to its instances' uids
            if work_dir.is_dir() and work_dir.stat().st_uid != os.geteuid():
                _chown_tree(work_dir, os.geteuid())

    def work_dir(self, fqfn: str, instance_id: int) -> Path:
        """The directory of one instance of ``fqfn`` (its code, state, tmp and log)."""
        return self.root / quote(fqfn, safe="") / str(instance_id)

    def claim(self, fqfn: str, instance_id: int, package: Path) -> InstanceUser:
        """A uid of its own for one instance of ``fqfn``, and its directory holding a copy
        of ``package`` (at ``<work_dir>/package/<name>``), owned by that uid."""
        work_dir = self.work_dir(fqfn, instance_id)
        work_dir.parent.mkdir(mode=0o711, exist_ok=True)
        work_dir.mkdir(mode=0o700, exist_ok=True)
        uid = self._claim_uid(work_dir)
        try:
            copy = work_dir / "package" / package.name
            if not _same_file(copy, package):
                copy.parent.mkdir(exist_ok=True)
                shutil.copy2(package, copy)
            _empty_folder(work_dir / "tmp")  # TMPDIR: what a run left there is not kept
            _chown_tree(work_dir, uid)
            work_dir.chmod(0o700)
        except BaseException:
            self.release(uid)
            raise
        return InstanceUser(uid, uid, work_dir, self.max_tasks, self.private)

    def release(self, uid: int) -> None:
        """The instance that ran as ``uid`` has exited: what it left running is killed, its
        directory goes back to the worker (the next holder of the uid cannot read it), and
        the uid is free again."""
        with self._lock:
            claimed = self._claimed.pop(uid, None)
        if claimed is None:
            return
        lock, work_dir = claimed
        _revoke(uid, work_dir)
        lock.truncate(0)  # nothing left to revoke for the next holder
        lock.close()  # closing the file releases its lock

    def forget(self, existing: set[str]) -> None:
        """Remove the directories of functions not in ``existing`` (deleted)."""
        for path in self.root.iterdir():
            if path.is_dir() and path.name != SCRIPT_CHECKS and unquote(path.name) not in existing:
                log.info("removing the instance directories of deleted function %s", path.name)
                shutil.rmtree(path, ignore_errors=True)

    def _revoke_abandoned(self) -> None:
        """Kill what runs as a uid of ours that no worker holds but one claimed (a killed
        worker's instances, and what they forked and left behind, setsid or not): at once,
        not when the uid is handed out again, which may be never."""
        for name in os.listdir(self._locks):
            uid = int(name) if name.isdigit() else -1
            if uid not in self._uids:
                continue
            with open(self._locks / name, "a+") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a running instance's
                _revoke_claim(lock, uid)

    def _claim_uid(self, work_dir: Path) -> int:
        """A uid no running instance on this host has, for ``work_dir``. A lock file per uid
        says who has it, and names the directory until it is released: what a holder that
        was never released left (its worker was killed) is revoked first."""
        for uid in self._uids:
            with self._lock:
                if uid in self._claimed:
                    continue
            lock = open(self._locks / str(uid), "a+")  # noqa: SIM115  # held while it runs
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            _revoke_claim(lock, uid)
            lock.write(str(work_dir))
            lock.flush()
            with self._lock:
                self._claimed[uid] = (lock, work_dir)
            return uid
        raise RuntimeError(
            f"every uid of instance_uids ({self._uids.start}-{self._uids.stop - 1}) is taken by "
            "a running instance: widen the range"
        )


def _revoke_claim(lock: IO[str], uid: int) -> None:
    """Revoke what the holder ``lock`` names left (its worker was killed), and empty it."""
    lock.seek(0)
    previous = lock.read().strip()
    if previous:
        log.info("killing what the instance that ran as uid %d left running", uid)
        _revoke(uid, Path(previous))
    lock.seek(0)
    lock.truncate()


def _revoke(uid: int, work_dir: Path) -> None:
    """Kill what still runs as ``uid`` and give ``work_dir`` back to this (root) process, if
    that uid still owns it."""
    for name in os.listdir("/proc"):
        if name.isdigit() and _real_uid(name) == uid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        if work_dir.stat().st_uid == uid:
            _chown_tree(work_dir, os.geteuid())


_UID_LINE = re.compile(rb"\nUid:\t(\d+)")


def _real_uid(pid: str) -> int | None:
    """The real uid of a process, from its status (its /proc owner is root once it changed
    users); None when it is gone. Read raw: this runs over every process on each release."""
    try:
        descriptor = os.open(f"/proc/{pid}/status", os.O_RDONLY)
    except OSError:
        return None
    try:
        found = _UID_LINE.search(os.read(descriptor, 1024))
    except OSError:
        return None
    finally:
        os.close(descriptor)
    return int(found[1]) if found else None


def _empty_folder(path: Path) -> None:
    """Make ``path`` an empty folder, whatever the previous holder left there (a link
    anywhere is removed, never followed)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()


def _same_file(copy: Path, original: Path) -> bool:
    """Whether ``copy`` is a copy of ``original`` still (packages are written once: their
    size and modification time tell)."""
    try:
        a, b = copy.stat(), original.stat()
    except FileNotFoundError:
        return False
    return (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)


def _chown_tree(root: Path, uid: int) -> None:
    """Give ``root`` and everything below it to ``uid`` (what a previous uid left too)."""
    os.lchown(root, uid, uid)
    for directory, subdirectories, files in os.walk(root):
        for name in [*subdirectories, *files]:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(directory, name), uid, uid)
