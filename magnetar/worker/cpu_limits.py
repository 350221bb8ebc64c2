"""CPU limits of instance processes: ``resources.cpu`` cores each, held by the kernel.

Before an instance process is handed its function, the worker moves it into a cgroup of its
own, ``<the worker's cgroup>/magnetar-instances/<worker pid>-<instance pid>``, whose CPU
quota is ``resources.cpu`` cores per 100 ms, and whose weight among the instances is
``resources.cpu`` too; what it forks stays in the group, and user code, running as another
user, cannot leave it. Spinning user code then takes its quota and
no more, instead of the cores the broker, the workers and the other tenants' instances run
on. This is what Apache Pulsar's Kubernetes runtime does with ``resources.cpu`` (a container
limit); its process runtime ignores it.

The cpu controller of cgroup v1 (``cpu.cfs_quota_us``) or v2 (``cpu.max``, where the
worker's cgroup lets the controller be enabled below it) is used, which takes root or a
cgroup delegated to the worker. Without one, instances run without a limit and the worker
says why once at start (``open_cpu_limits``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuLimits", "find_cpu_cgroup", "open_cpu_limits"]

log = logging.getLogger(__name__)

PERIOD_US = 100_000
_MIN_QUOTA_US = 1_000
"""The kernel refuses a quota below 1 ms a period."""
_GROUP = "magnetar-instances"


@dataclass(frozen=True)
class CpuCgroup:
    """The worker's own cgroup in the hierarchy that has the cpu controller."""

    directory: Path
    version: int


def find_cpu_cgroup(mountinfo: str | None = None, cgroups: str | None = None) -> CpuCgroup | str:
    """The worker's cgroup with the cpu controller, from ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup`` (given as text to read others); else why there is none."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if cgroups is None:
        cgroups = Path("/proc/self/cgroup").read_text()
    own: dict[str, str] = {}  # "cpu" (v1) or "" (v2) -> the worker's cgroup path
    for line in cgroups.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            own[""] = path
        elif "cpu" in controllers.split(","):
            own["cpu"] = path
    why = "no cgroup hierarchy with the cpu controller is mounted"
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, mount_point = fields[3], fields[4]
        kind, *super_fields = line.split(" - ", 1)[1].split()
        super_options = super_fields[-1].split(",") if super_fields else []
        if kind == "cgroup" and "cpu" in super_options and "cpu" in own:
            return _within(mount_point, root, own["cpu"], 1)
        if kind == "cgroup2" and "" in own:
            found = _within(mount_point, root, own[""], 2)
            if isinstance(found, str):
                why = found
            elif "cpu" in (found.directory / "cgroup.controllers").read_text().split():
                return found
            else:  # (a host with both: v1 may hold the cpu controller)
                why = f"cgroup v2 at {found.directory} offers no cpu controller"
    return why


def _within(mount_point: str, root: str, path: str, version: int) -> CpuCgroup | str:
    """The directory of cgroup ``path`` in a hierarchy mounted at ``mount_point`` from
    ``root`` (a container sees its own cgroup as the root)."""
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        return f"the worker's cgroup {path} is outside the mounted hierarchy ({root})"
    return CpuCgroup(Path(mount_point) / relative, version)


class CpuLimits:
    """Per-instance cgroups under the worker's cgroup (see the module doc)."""

    def __init__(self, cgroup: CpuCgroup) -> None:
        self.version = cgroup.version
        self._parent = cgroup.directory
        self.root = cgroup.directory / _GROUP
        self._prefix = f"{os.getpid()}-"

    def prepare(self) -> None:
        """Create the group the instances' groups go in (v2: with the cpu controller enabled
        for them), and remove empty groups of workers that are gone; OSError if the worker
        may not."""
        if self.version == 2:
            _enable_cpu(self._parent)
        self.root.mkdir(exist_ok=True)
        if self.version == 2:
            _enable_cpu(self.root)
        for group in self.root.iterdir():
            worker_pid = group.name.partition("-")[0]
            if group.is_dir() and worker_pid.isdigit() and not _alive(int(worker_pid)):
                with contextlib.suppress(OSError):  # a group with processes left stays
                    group.rmdir()

    def limit(self, pid: int, cores: float) -> None:
        """Move process ``pid`` into a group of its own held to ``cores``; OSError if it
        cannot be (the instance must not run unlimited)."""
        group = self._group(pid)
        group.mkdir(exist_ok=True)
        # as many cores as the host has, or more, is no limit (and a quota the kernel takes)
        quota = max(_MIN_QUOTA_US, round(cores * PERIOD_US))
        unlimited = cores >= (os.cpu_count() or 1)
        if self.version == 1:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text("-1" if unlimited else str(quota))
        else:
            (group / "cpu.max").write_text(f"{'max' if unlimited else quota} {PERIOD_US}")
        # among instances, a share of the cores as their resources.cpu, however many
        # threads each runs
        _set_weight(group, self.version, cores)
        (group / "cgroup.procs").write_text(str(pid))

    def release(self, pid: int) -> None:
        """Remove the group of ``pid``, which has exited (a group that still holds what it
        forked is left, to be removed by the next worker's ``prepare``)."""
        try:
            self._group(pid).rmdir()
        except OSError as error:
            if error.errno != errno.ENOENT:
                log.debug("the CPU group of process %s stays: %s", pid, error)

    def _group(self, pid: int) -> Path:
        return self.root / f"{self._prefix}{pid}"


def _enable_cpu(directory: Path) -> None:
    control = directory / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def _set_weight(group: Path, version: int, cores: float) -> None:
    """The group's CPU weight under contention, as ``cores`` busy threads weigh."""
    if version == 1:  # 1024 a thread, 2 to 262144
        (group / "cpu.shares").write_text(str(min(max(round(1024 * cores), 2), 262_144)))
    else:  # 100 a thread, 1 to 10000
        (group / "cpu.weight").write_text(str(min(max(round(100 * cores), 1), 10_000)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def open_cpu_limits() -> CpuLimits | None:
    """The worker's CPU limits, or None (logged, with why) where it cannot set any."""
    try:
        found = find_cpu_cgroup()
        if isinstance(found, str):
            raise OSError(found)
        limits = CpuLimits(found)
        limits.prepare()
    except OSError as error:
        log.warning(
            "instances run without CPU limits (resources.cpu is not enforced): %s; run the "
            "worker as root, or in a cgroup delegated to it",
            error,
        )
        return None
    log.info("instances are held to their resources.cpu (cgroup v%s)", limits.version)
    return limits
