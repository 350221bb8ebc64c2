"""What the REST layer is given by the worker: its managers, nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from magnetar.instance.metrics import MetricsSnapshot
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.config import WorkerConfig
from magnetar.worker.functions import FunctionManager
from magnetar.worker.leader import LeaderService
from magnetar.worker.membership import Membership
from magnetar.worker.metadata import MetadataManager
from magnetar.worker.packages import PackageStore

__all__ = ["InstanceStatuses", "RestServices"]


class InstanceStatuses(Protocol):
    """The runtime manager's view of the instances running here."""

    def status(self, key: str) -> MetricsSnapshot | None: ...


@dataclass(frozen=True)
class RestServices:
    """The worker's managers, as the REST handlers use them."""

    config: WorkerConfig
    metadata: MetadataManager
    assignments: AssignmentManager
    membership: Membership
    leader: LeaderService
    functions: FunctionManager
    packages: PackageStore
    instances: InstanceStatuses

    def ready(self) -> bool:
        """Caught up with the cluster and a leader is known."""
        return (
            self.metadata.wait_caught_up(0)
            and self.assignments.wait_caught_up(0)
            and self.assignments.current is not None
        )
