"""What the REST layer is given by the worker: its managers, nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import httpx

from magnetar.instance.metrics import MetricsSnapshot
from magnetar.statestore import StateQueryService
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.auth import AdminAuth
from magnetar.worker.cluster_key import PeerSeal
from magnetar.worker.config import WorkerConfig
from magnetar.worker.function_auth import TokenSeal
from magnetar.worker.functions import FunctionManager
from magnetar.worker.leader import LeaderService
from magnetar.worker.membership import Membership
from magnetar.worker.metadata import MetadataManager
from magnetar.worker.package_registry import PackageRegistry
from magnetar.worker.packages import PackageStore
from magnetar.worker.runtime import InstanceLogs
from magnetar.worker.script_check import ScriptChecker
from magnetar.worker.tenancy import Tenancy, TenancyManager
from magnetar.worker.trigger import FunctionTrigger

__all__ = ["InstanceStatuses", "RestServices"]


class InstanceStatuses(Protocol):
    """The runtime manager's view of the instances running here."""

    def status(self, key: str) -> MetricsSnapshot | None:
        """The status of an instance assigned here; None if it is not assigned here."""
        ...

    def statuses(self) -> dict[str, MetricsSnapshot]:
        """Every instance assigned here, by instance key."""
        ...

    def restart(self, key: str) -> bool:
        """Restart an instance assigned here; False if it is not assigned here."""
        ...


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
    trigger: FunctionTrigger
    tenancy: Tenancy
    """Tenants and namespaces: the metadata topic's, or the broker admin API's."""
    http: httpx.Client
    """The worker's HTTP client for other workers (its connections are kept and reused)."""
    scripts: ScriptChecker
    """Checks submitted JavaScript scripts, each in a process of its own."""
    auth: AdminAuth | None = None
    """Token checks; None when authentication is off."""
    state: StateQueryService | None = None
    """Function state queries and puts; None on a worker that serves no state."""
    token_seal: TokenSeal | None = None
    """Seals the token kept with a function a caller submits (None: no cluster key)."""
    instance_logs: InstanceLogs | None = None
    """Where each instance of this worker logs; None: instances log to the worker's log."""
    peer_seal: PeerSeal | None = None
    """Checks that a call on an internal path comes from a worker; None: unchecked (the
    cluster has no key)."""
    package_registry: PackageRegistry | None = None
    """Pulsar's package management (named, versioned packages); None: not served."""

    @property
    def replicated_tenancy(self) -> TenancyManager | None:
        """The tenancy kept in the metadata topic (which takes forwarded changes); None when
        the broker's admin API keeps it."""
        return self.tenancy if isinstance(self.tenancy, TenancyManager) else None

    def ready(self) -> bool:
        """Caught up with the cluster and a leader is known."""
        return (
            self.metadata.wait_caught_up(0)
            and self.assignments.wait_caught_up(0)
            and self.assignments.current is not None
        )
