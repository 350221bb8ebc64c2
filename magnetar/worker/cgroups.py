"""The cgroups a worker holds its instance processes in, one per process and controller.

Before an instance process is handed its function, the worker moves it into a group of its
own, ``<the worker's cgroup>/magnetar-instances/<worker pid>-<instance pid>``, in the
hierarchy of each controller it limits (``cpu_limits``, ``memory_limits``): cgroup v1 has a
hierarchy per controller, v2 one for all (there the limits share the group). What the process
forks stays in its group, and user code, running as another user, cannot leave it.

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
from pathlib import Path
from typing import TypeVar

from magnetar.worker.pids import pid_alive

__all__ = ["Cgroup", "InstanceGroups", "find_cgroup", "open_groups"]

log = logging.getLogger(__name__)

_GROUP = "magnetar-instances"
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
            found = _within(mount_point, root, own[""], 2)
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
            self._enable(self._parent)
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
