"""The cgroups a worker holds its instance processes in, one per process and controller.

Before an instance process is handed its function, the worker moves it into a group of its
own, ``<the worker's cgroup>/magnetar-instances/<worker pid>-<instance pid>``, in the
hierarchy of each controller it limits (``cpu_limits``, ``memory_limits``): cgroup v1 has a
hierarchy per controller, v2 one for all (there the limits share the group). What the process
forks stays in its group, and user code, running as another user, cannot leave it.

cgroup v2 passes a controller on to the groups below a group only while that group holds no
process of its own, and the worker's cgroup holds the worker (a systemd service's holds its
processes). So on v2 the worker first moves what runs in its cgroup, itself and what it
started, into a group of their own, ``<the worker's cgroup>/magnetar-worker``; another
program's process there makes it give up instead (the cgroup is not the worker's to manage).

That takes root or a cgroup delegated to the worker; where there is none, ``open_groups``
says why and the worker runs its instances without the limit.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

from magnetar.worker.pids import pid_alive

__all__ = ["Cgroup", "InstanceGroups", "find_cgroup", "open_groups"]

log = logging.getLogger(__name__)

_GROUP = "magnetar-instances"
_WORKER_GROUP = "magnetar-worker"
"""Where a v2 worker moves the processes of its cgroup (see the module doc)."""
_VACATE_TRIES = 3
"""A process the worker starts while its cgroup is vacated lands there: list and move again."""
_RELEASE_WAIT_S = 1.0


@dataclass(frozen=True)
class Cgroup:
    """The worker's own cgroup in the hierarchy that has a controller."""

    directory: Path
    version: int


def find_cgroup(
    controller: str, mountinfo: str | None = None, cgroups: str | None = None
) -> Cgroup | str:
    """The worker's cgroup with ``controller``, from ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup`` (given as text to read others); else why there is none."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if cgroups is None:
        cgroups = Path("/proc/self/cgroup").read_text()
    own: dict[str, str] = {}  # controller (v1) or "" (v2) -> the worker's cgroup path
    for line in cgroups.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            own[""] = path
        elif controller in controllers.split(","):
            own[controller] = path
    why = f"no cgroup hierarchy with the {controller} controller is mounted"
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, mount_point = fields[3], fields[4]
        kind, *super_fields = line.split(" - ", 1)[1].split()
        super_options = super_fields[-1].split(",") if super_fields else []
        if kind == "cgroup" and controller in super_options and controller in own:
            return _within(mount_point, root, own[controller], 1)
        if kind == "cgroup2" and "" in own:
            unified = PurePosixPath(own[""])
            if unified.name == _WORKER_GROUP:  # moved there by a worker (this one or before)
                unified = unified.parent
            found = _within(mount_point, root, str(unified), 2)
            if isinstance(found, str):
                why = found
            elif controller in (found.directory / "cgroup.controllers").read_text().split():
                return found
            else:  # (a host with both: v1 may hold the controller)
                why = f"cgroup v2 at {found.directory} offers no {controller} controller"
    return why


def _within(mount_point: str, root: str, path: str, version: int) -> Cgroup | str:
    """The directory of cgroup ``path`` in a hierarchy mounted at ``mount_point`` from
    ``root`` (a container sees its own cgroup as the root)."""
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        return f"the worker's cgroup {path} is outside the mounted hierarchy ({root})"
    return Cgroup(Path(mount_point) / relative, version)


class InstanceGroups:
    """Per-instance groups of one controller under the worker's cgroup (see the module doc)."""

    controller: str

    def __init__(self, cgroup: Cgroup) -> None:
        self.version = cgroup.version
        self._parent = cgroup.directory
        self.root = cgroup.directory / _GROUP
        self._prefix = f"{os.getpid()}-"

    def prepare(self) -> None:
        """Create the group the instances' groups go in (v2: with the controller enabled for
        them), and remove empty groups of workers that are gone; OSError if the worker may
        not."""
        if self.version == 2:
            self._enable_with_processes_moved(self._parent)
        self.root.mkdir(exist_ok=True)
        if self.version == 2:
            self._enable(self.root)
        for group in self.root.iterdir():
            worker_pid = group.name.partition("-")[0]
            if group.is_dir() and worker_pid.isdigit() and not pid_alive(int(worker_pid)):
                with contextlib.suppress(OSError):  # a group with processes left stays
                    group.rmdir()

    def group(self, pid: int) -> Path:
        """The group of instance process ``pid``."""
        return self.root / f"{self._prefix}{pid}"

    def join(self, pid: int) -> None:
        """Move process ``pid`` into its group (made, and limited, before)."""
        (self.group(pid) / "cgroup.procs").write_text(str(pid))

    def release(self, pid: int) -> None:
        """Remove the group of ``pid``, which has exited. What it forked was just killed
        (``isolation``) and leaves the group as it exits: a group that still holds a process
        after ``_RELEASE_WAIT_S`` is left, to be removed by the next worker's ``prepare``."""
        deadline = time.monotonic() + _RELEASE_WAIT_S
        while True:
            try:
                self.group(pid).rmdir()
                return
            except OSError as error:
                if error.errno == errno.ENOENT:
                    return
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.debug("the %s group of process %s stays: %s", self.controller, pid, error)
                    return
            time.sleep(0.02)

    def _enable(self, directory: Path) -> None:
        control = directory / "cgroup.subtree_control"
        if self.controller not in control.read_text().split():
            control.write_text(f"+{self.controller}")

    def _enable_with_processes_moved(self, directory: Path) -> None:
        """``_enable`` in the worker's own cgroup, once its processes are in
        ``_WORKER_GROUP``; OSError naming a process that is not the worker's."""
        if not (directory / "cgroup.type").exists():  # the root, where processes may stay
            self._enable(directory)
            return
        for attempt in range(_VACATE_TRIES):
            held = [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
            strangers = [pid for pid in held if not _started_by_worker(pid)]
            if strangers:
                raise OSError(
                    errno.EBUSY,
                    f"cgroup v2 enables the {self.controller} controller for the groups below "
                    f"{directory} only once no process is in it, and it holds processes that "
                    f"are not the worker's ({_described(strangers)}): run the worker in a "
                    "cgroup of its own (a systemd service with Delegate=yes)",
                )
            if held:
                (directory / _WORKER_GROUP).mkdir(exist_ok=True)
                for pid in held:
                    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                        (directory / _WORKER_GROUP / "cgroup.procs").write_text(str(pid))
            try:
                self._enable(directory)
                return
            except OSError as error:
                if error.errno != errno.EBUSY or attempt == _VACATE_TRIES - 1:
                    raise


def _started_by_worker(pid: int) -> bool:
    """``pid`` is the worker or a process it started (its child, or theirs)."""
    own = os.getpid()
    while pid != own:
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # exited: it no longer holds the cgroup
            return True
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return True


def _described(pids: list[int]) -> str:
    named = []
    for pid in pids[:3]:
        with contextlib.suppress(OSError):
            named.append(f"{Path(f'/proc/{pid}/comm').read_text().strip()} {pid}")
    return ", ".join(named) + (f" and {len(pids) - 3} more" if len(pids) > 3 else "")


_Groups = TypeVar("_Groups", bound=InstanceGroups)


def open_groups(kind: type[_Groups]) -> _Groups | str:
    """``kind``'s groups under the worker's cgroup, prepared; else why not."""
    try:
        found = find_cgroup(kind.controller)
        if isinstance(found, str):
            return found
        groups = kind(found)
        groups.prepare()
    except OSError as error:
        return str(error)
    return groups
