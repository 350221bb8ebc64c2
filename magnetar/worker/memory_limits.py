"""Memory limits of instance processes, what they start included: ``resources.ram`` each.

The worker's watchdog (``runtime``) stops an instance whose memory passes its
``resources.ram``, gracefully, so it acknowledges what it finished. The resident size of the
instance's process does not show what the processes it starts hold, nor what it keeps in its
own ``/tmp`` and ``/dev/shm`` (memory: see ``magnetar.instance.sandbox``). So each instance
process is in a memory cgroup of its own (``magnetar.worker.cgroups``):

- the watchdog also reads the group's anonymous and tmpfs memory (``used``), its children's
  included;
- the kernel holds the group to a hard limit a quarter above ``resources.ram`` (at least
  64 MiB above), for memory that grows faster than the watchdog looks; an instance the kernel
  kills there is reported out of memory (``oom_kills``).

Apache Pulsar's Kubernetes runtime makes ``resources.ram`` (plus ``percentMemoryPadding``) the
container's memory limit; its process runtime limits nothing.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from magnetar.worker.cgroups import InstanceGroups, open_groups

__all__ = ["MemoryLimits", "hard_limit", "open_memory_limits"]

log = logging.getLogger(__name__)

_MIN_PADDING_BYTES = 64 * 1024 * 1024


def hard_limit(ram_bytes: int) -> int:
    """The kernel's limit for an instance of ``resources.ram`` ``ram_bytes``: above it, so
    the watchdog's graceful stop comes first."""
    return ram_bytes + max(ram_bytes // 4, _MIN_PADDING_BYTES)


class MemoryLimits(InstanceGroups):
    """Per-instance memory groups (see the module doc)."""

    controller = "memory"

    def limit(self, pid: int, ram_bytes: int | None) -> None:
        """Move process ``pid`` into a group of its own held to ``hard_limit(ram_bytes)``
        (None: only counted); OSError if it cannot be (it must not run unlimited)."""
        group = self.group(pid)
        group.mkdir(exist_ok=True)
        if ram_bytes is not None:
            hard = str(hard_limit(ram_bytes))
            if self.version == 1:
                (group / "memory.limit_in_bytes").write_text(hard)
                swap = group / "memory.memsw.limit_in_bytes"  # with swap accounting only
                if swap.exists():
                    swap.write_text(hard)  # memory and swap together: none swapped beyond
            else:
                (group / "memory.max").write_text(hard)
                with contextlib.suppress(FileNotFoundError):  # a host without swap
                    (group / "memory.swap.max").write_text("0")
        self.join(pid)

    def used(self, pid: int) -> int | None:
        """The anonymous and tmpfs memory of the group of ``pid`` (its page cache, which the
        kernel reclaims, is not counted); None when it cannot be read."""
        names = ("total_rss", "total_shmem") if self.version == 1 else ("anon", "shmem")
        stat = _fields(self.group(pid) / "memory.stat")
        return sum(stat.get(name, 0) for name in names) if stat else None

    def oom_kills(self, pid: int) -> int:
        """How many processes of the group of ``pid`` the kernel killed over its limit."""
        events = "memory.oom_control" if self.version == 1 else "memory.events"
        return _fields(self.group(pid) / events).get("oom_kill", 0)


def _fields(path: Path) -> dict[str, int]:
    """A cgroup file of ``name value`` lines; empty when it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {name: int(value) for name, _, value in (line.partition(" ") for line in lines)}


def open_memory_limits() -> MemoryLimits | None:
    """The worker's memory limits, or None (logged, with why) where it cannot set any."""
    limits = open_groups(MemoryLimits)
    if isinstance(limits, str):
        log.warning(
            "the memory of what instances start is not counted against resources.ram, nor held "
            "by the kernel: %s; run the worker as root, or in a cgroup delegated to it",
            limits,
        )
        return None
    log.info(
        "instances are held to their resources.ram with what they start (cgroup v%s)",
        limits.version,
    )
    return limits
