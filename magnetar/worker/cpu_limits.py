"""CPU limits of instance processes: ``resources.cpu`` cores each, held by the kernel.

Each instance process is in a cgroup of its own (``magnetar.worker.cgroups``) whose CPU quota
is ``resources.cpu`` cores per 100 ms, and whose weight among the instances is
``resources.cpu`` too. Spinning user code then takes its quota and no more, instead of the
cores the broker, the workers and the other tenants' instances run on. This is what Apache
Pulsar's Kubernetes runtime does with ``resources.cpu`` (a container limit); its process
runtime ignores it.

The cpu controller of cgroup v1 (``cpu.cfs_quota_us``) or v2 (``cpu.max``, where the
worker's cgroup lets the controller be enabled below it) is used. Without one, instances run
without a limit and the worker says why once at start (``open_cpu_limits``).
"""

from __future__ import annotations

import logging
import os

from magnetar.worker.cgroups import InstanceGroups, open_groups

__all__ = ["CpuLimits", "open_cpu_limits"]

log = logging.getLogger(__name__)

PERIOD_US = 100_000
_MIN_QUOTA_US = 1_000
"""The kernel refuses a quota below 1 ms a period."""


class CpuLimits(InstanceGroups):
    """Per-instance CPU quotas (see the module doc)."""

    controller = "cpu"

    def limit(self, pid: int, cores: float) -> None:
        """Move process ``pid`` into a group of its own held to ``cores``; OSError if it
        cannot be (the instance must not run unlimited)."""
        group = self.group(pid)
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
        if self.version == 1:  # 1024 a thread, 2 to 262144
            (group / "cpu.shares").write_text(str(min(max(round(1024 * cores), 2), 262_144)))
        else:  # 100 a thread, 1 to 10000
            (group / "cpu.weight").write_text(str(min(max(round(100 * cores), 1), 10_000)))
        self.join(pid)


def open_cpu_limits() -> CpuLimits | None:
    """The worker's CPU limits, or None (logged, with why) where it cannot set any."""
    limits = open_groups(CpuLimits)
    if isinstance(limits, str):
        log.warning(
            "instances run without CPU limits (resources.cpu is not enforced): %s; run the "
            "worker as root, or in a cgroup delegated to it",
            limits,
        )
        return None
    log.info("instances are held to their resources.cpu (cgroup v%s)", limits.version)
    return limits
