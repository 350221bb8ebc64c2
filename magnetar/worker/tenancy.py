"""Tenants and namespaces, as Apache Pulsar has them.

A function lives in a namespace of a tenant, and Pulsar refuses to register one whose
tenant or namespace does not exist. A worker has one source of truth for them
(:class:`Tenancy`):

* :class:`TenancyManager` keeps them in the metadata topic (entry kinds ``tenant`` and
  ``namespace``), written by the leader like functions. ``public``, ``public/default`` and
  the system namespace exist from the start. This is the store without a broker admin API
  (pulsar-lite has none).
* ``BrokerTenancy`` (``broker_tenancy``) asks the Apache Pulsar broker's admin API, the
  truth when the worker is given ``pulsar_admin_url``.

Both answer with the codes and reasons of Pulsar's TenantsBase and NamespacesBase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import httpx

from magnetar.worker.admission import is_named_entity
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.cluster_key import PeerSeal
from magnetar.worker.exceptions import (
    AlreadyExistsError,
    NamespaceNotFoundError,
    NotEmptyError,
    PreconditionFailedError,
    RequestRefusedError,
    TenantNotFoundError,
)
from magnetar.worker.leader import LeaderService
from magnetar.worker.leader_channel import LeaderChannel
from magnetar.worker.metadata import Entry, MetadataManager

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_TENANT",
    "FORWARD_PATH",
    "Tenancy",
    "TenancyChange",
    "TenancyManager",
    "check_namespace_name",
    "default_entries",
]

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "public/default"
FORWARD_PATH = "/admin/v2/worker/internal/tenancy-changes"

_TENANT = "tenant"
_NAMESPACE = "namespace"

TenancyOp = Literal[
    "create_tenant", "update_tenant", "delete_tenant", "create_namespace", "delete_namespace"
]


class Tenancy(Protocol):
    """Tenants and namespaces, answered with Pulsar's codes (RequestRefusedError)."""

    def clusters(self) -> list[str]:
        """The clusters a tenant may be allowed on."""
        ...

    def tenants(self) -> list[str]:
        """Every tenant, sorted."""
        ...

    def tenant(self, tenant: str) -> dict[str, Any]:
        """A tenant's TenantInfo: ``adminRoles`` and ``allowedClusters``."""
        ...

    def create_tenant(self, tenant: str, info: Any, authorization: str | None) -> None:
        """Create a tenant from a TenantInfo JSON value (as sent, unchecked)."""
        ...

    def update_tenant(self, tenant: str, info: Any, authorization: str | None) -> None:
        """Replace a tenant's TenantInfo."""
        ...

    def delete_tenant(self, tenant: str, force: bool, authorization: str | None) -> None:
        """Delete a tenant that has no namespace left."""
        ...

    def namespaces(self, tenant: str) -> list[str]:
        """A tenant's namespaces, ``tenant/namespace``, sorted."""
        ...

    def create_namespace(self, namespace: str, policies: Any, authorization: str | None) -> None:
        """Create ``tenant/namespace`` with Pulsar's Policies JSON (or None)."""
        ...

    def delete_namespace(self, namespace: str, force: bool, authorization: str | None) -> None:
        """Delete a namespace that holds no function."""
        ...

    def check_namespace(self, tenant: str, namespace: str) -> None:
        """Refuse, as Pulsar's function registration does (400 "Tenant does not exist" /
        "Namespace does not exist"), unless both exist."""
        ...

    def is_tenant_admin(self, tenant: str, role: str) -> bool:
        """Whether ``role`` is in ``tenant``'s ``adminRoles`` (False: no such tenant)."""
        ...


def check_namespace_name(namespace: str) -> tuple[str, str]:
    """``tenant/namespace`` split; 412 "Namespace name is not valid" when it is not that."""
    tenant, _, local = namespace.partition("/")
    if not (_valid(tenant) and _valid(local)):
        raise PreconditionFailedError("Namespace name is not valid")
    return tenant, local


def _valid(name: str) -> bool:
    return is_named_entity(name)


def default_entries(system_namespace: str, cluster: str) -> dict[str, dict[str, Entry]]:
    """What exists from the start: ``public/default`` and the system namespace, with their
    tenants (allowed on ``cluster``), as in a new Apache Pulsar standalone."""
    info = {"adminRoles": [], "allowedClusters": [cluster]}
    policies = {"replication_clusters": [cluster]}
    return {
        _TENANT: {DEFAULT_TENANT: info, system_namespace.partition("/")[0]: info},
        _NAMESPACE: {DEFAULT_NAMESPACE: policies, system_namespace: policies},
    }


@dataclass(frozen=True)
class TenancyChange:
    """One change to a tenant or namespace, as sent to the leader."""

    op: TenancyOp
    name: str
    """The tenant, or ``tenant/namespace``."""
    value: Any = None
    """TenantInfo or Policies JSON, as the caller sent it."""
    force: bool = False

    @property
    def kind(self) -> str:
        return _TENANT if self.op.endswith("_tenant") else _NAMESPACE

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "name": self.name, "value": self.value, "force": self.force}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TenancyChange:
        op = data["op"]
        if op not in get_args(TenancyOp):
            raise KeyError(f"unknown operation {op!r}")
        return cls(op, str(data["name"]), data.get("value"), bool(data.get("force", False)))


class TenancyManager:
    """Tenants and namespaces in the metadata topic, changed through the leader."""

    def __init__(
        self,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        leader: LeaderService,
        cluster: str,
        system_namespace: str,
        timeout_s: float,
        http: httpx.Client,
        peer_seal: PeerSeal | None = None,
    ) -> None:
        self._metadata = metadata
        self._leader = leader
        self._cluster = cluster
        self._system_namespace = system_namespace
        self._timeout = timeout_s
        self._channel = LeaderChannel(
            metadata, assignments, leader.worker_id, timeout_s, http, peer_seal
        )

    # --- reads ----------------------------------------------------------------------------
    # A read first catches up with the metadata topic, so it sees what any worker changed
    # before it was asked (an admin call is rare; a stale "does not exist" would mislead).

    def clusters(self) -> list[str]:
        return [self._cluster]

    def tenants(self) -> list[str]:
        self._catch_up()
        return sorted(self._metadata.entries(_TENANT))

    def tenant(self, tenant: str) -> dict[str, Any]:
        self._catch_up()
        info = self._metadata.entries(_TENANT).get(tenant)
        if info is None:
            raise TenantNotFoundError("Tenant does not exist")
        return info

    def namespaces(self, tenant: str) -> list[str]:
        if not _valid(tenant):
            raise PreconditionFailedError("Tenant name is not valid")
        self._catch_up()
        if tenant not in self._metadata.entries(_TENANT):
            raise TenantNotFoundError("Tenant not found")
        return self._namespaces_of(tenant)

    def check_namespace(self, tenant: str, namespace: str) -> None:
        if not self._has_namespace(tenant, namespace):
            self._catch_up()  # only on a miss: creating a function stays quick
        if tenant not in self._metadata.entries(_TENANT):
            raise RequestRefusedError("Tenant does not exist")
        if not self._has_namespace(tenant, namespace):
            raise RequestRefusedError("Namespace does not exist")

    def is_tenant_admin(self, tenant: str, role: str) -> bool:
        if self._lists_admin(tenant, role):
            return True
        # only on a miss: a role just made admin is one at once, on every worker
        self._catch_up()
        return self._lists_admin(tenant, role)

    def _lists_admin(self, tenant: str, role: str) -> bool:
        info = self._metadata.entries(_TENANT).get(tenant) or {}
        roles = info.get("adminRoles") or []
        return isinstance(roles, list) and role in roles

    def _has_namespace(self, tenant: str, namespace: str) -> bool:
        return f"{tenant}/{namespace}" in self._metadata.entries(_NAMESPACE)

    def _catch_up(self) -> None:
        self._metadata.catch_up(self._timeout)

    # --- writes ---------------------------------------------------------------------------

    def create_tenant(self, tenant: str, info: Any, authorization: str | None) -> None:
        self._submit(TenancyChange("create_tenant", tenant, info), authorization)

    def update_tenant(self, tenant: str, info: Any, authorization: str | None) -> None:
        self._submit(TenancyChange("update_tenant", tenant, info), authorization)

    def delete_tenant(self, tenant: str, force: bool, authorization: str | None) -> None:
        self._submit(TenancyChange("delete_tenant", tenant, force=force), authorization)

    def create_namespace(self, namespace: str, policies: Any, authorization: str | None) -> None:
        self._submit(TenancyChange("create_namespace", namespace, policies), authorization)

    def delete_namespace(self, namespace: str, force: bool, authorization: str | None) -> None:
        self._submit(TenancyChange("delete_namespace", namespace, force=force), authorization)

    def apply_forwarded(self, change: TenancyChange) -> int:
        """On the leader: apply a change another worker forwarded; the new version."""
        self._write(change)
        return self._metadata.version_of(self._metadata.entry_key(change.kind, change.name))

    def _submit(self, change: TenancyChange, authorization: str | None) -> None:
        self._channel.submit(
            lambda: self._write(change),
            self._metadata.entry_key(change.kind, change.name),
            FORWARD_PATH,
            change.to_json(),
            authorization,
        )

    def _write(self, change: TenancyChange) -> None:
        self._leader.write_entry(
            change.kind, change.name, lambda current: self._decide(change, current)
        )

    # --- Pulsar's rules (run on the leader while writes are serialized) ---------------------

    def _decide(self, change: TenancyChange, current: Entry | None) -> Entry | None:
        """The new value, or Pulsar's refusal, in the order Pulsar checks."""
        name = change.name
        if change.op == "create_tenant":
            if not _valid(name):
                raise PreconditionFailedError("Tenant name is not valid")
            info = self._tenant_info(change.value)
            if current is not None:
                raise AlreadyExistsError("Tenant already exist")
            return info
        if change.op == "update_tenant":
            info = self._tenant_info(change.value)
            if current is None:
                raise TenantNotFoundError(f"Tenant {name} not found")
            return info
        if change.op == "delete_tenant":
            if change.force:
                raise RequestRefusedError("Broker doesn't allow forced deletion of tenants", 405)
            if current is None:
                raise TenantNotFoundError("Tenant doesn't exist")
            if self._namespaces_of(name):
                raise NotEmptyError("The tenant still has active namespaces")
            return None
        tenant, _ = check_namespace_name(name)
        if change.op == "create_namespace":
            policies = self._policies(tenant, change.value)
            if current is not None:
                raise AlreadyExistsError("Namespace already exists")
            return policies
        if change.force:
            raise RequestRefusedError("Broker doesn't allow forced deletion of namespaces", 405)
        if current is None:
            raise NamespaceNotFoundError(f"Namespace {name} does not exist.")
        prefix = f"{name}/"
        if name == self._system_namespace or any(
            fqfn.startswith(prefix) for fqfn in self._metadata.functions()
        ):
            # the system namespace holds the cluster's own topics; others hold functions
            raise NotEmptyError("Cannot delete non empty namespace")
        return None

    def _tenant_info(self, value: Any) -> Entry:
        """A TenantInfo checked as Pulsar's validateClusters and validateAdminRole do."""
        if not isinstance(value, dict):
            raise PreconditionFailedError("TenantInfo is null")
        clusters = value.get("allowedClusters")
        if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
            raise PreconditionFailedError("Clusters cannot be null")
        if not clusters or any(not c.strip() for c in clusters):
            raise PreconditionFailedError("Clusters cannot be empty or blank")
        if not set(clusters) <= set(self.clusters()):
            raise PreconditionFailedError("Clusters do not exist")
        roles = value.get("adminRoles") or []
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise PreconditionFailedError("AdminRoles must be a list of role names")
        if any(r.strip() != r for r in roles):
            raise PreconditionFailedError("AdminRoles contains whitespace in the beginning or end.")
        return {"adminRoles": sorted(set(roles)), "allowedClusters": sorted(set(clusters))}

    def _policies(self, tenant: str, value: Any) -> Entry:
        """The Policies a namespace is created with: its replication clusters (by default
        this cluster), each allowed for the tenant, as Pulsar's validatePolicies checks."""
        policies = value if isinstance(value, dict) else {}
        clusters = policies.get("replication_clusters") or [self._cluster]
        if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
            raise RequestRefusedError("replication_clusters must be a list of cluster names")
        info = self._metadata.entries(_TENANT).get(tenant)
        if info is None:
            raise TenantNotFoundError("Tenant does not exist")
        for cluster in clusters:
            if cluster not in info.get("allowedClusters", []):
                raise RequestRefusedError(
                    f"Cluster [{cluster}] is not in the list of allowed clusters list for "
                    f"tenant [{tenant}]",
                    403,
                )
        kept: Entry = {"replication_clusters": sorted(set(clusters))}
        if isinstance(policies.get("bundles"), dict):
            kept["bundles"] = policies["bundles"]
        return kept

    def _namespaces_of(self, tenant: str) -> list[str]:
        prefix = f"{tenant}/"
        return sorted(ns for ns in self._metadata.entries(_NAMESPACE) if ns.startswith(prefix))
