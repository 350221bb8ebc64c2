"""Function management as the REST API sees it: register, update, delete, start, stop.

A change is data (``FunctionChange``), so the same change runs on the leader whether it
arrived there directly or was forwarded by another worker. Every call returns only once
this worker has applied the change (read-your-writes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import httpx

from magnetar.instance.config import FunctionConfig
from magnetar.worker.admission import Admission
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.cluster_key import PeerSeal
from magnetar.worker.exceptions import (
    FunctionExistsError,
    FunctionNotFoundError,
    RequestRefusedError,
)
from magnetar.worker.leader import LeaderService
from magnetar.worker.leader_channel import LeaderChannel
from magnetar.worker.metadata import FunctionRecord, MetadataManager

__all__ = ["FORWARD_PATH", "FunctionChange", "FunctionManager", "NamespaceCheck"]

log = logging.getLogger(__name__)

FORWARD_PATH = "/admin/v2/worker/internal/function-changes"

Operation = Literal["register", "update", "delete", "start", "stop"]
_OPERATIONS = get_args(Operation)

NamespaceCheck = Callable[[str, str], None]
"""Raises (Pulsar's 400 "Tenant does not exist" / "Namespace does not exist") unless the
tenant and namespace exist."""


@dataclass(frozen=True)
class FunctionChange:
    """One change to one function, as sent to the leader."""

    op: Operation
    fqfn: str
    config: dict[str, Any] | None = None
    package: dict[str, Any] | None = None
    instance_id: int | None = None
    """For start/stop: one instance; None means all."""
    auth_data: dict[str, Any] | None = None
    """For register/update: the credentials the function's instances use from now on
    (``FunctionAuthData.to_json()``); None keeps those it has."""

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "fqfn": self.fqfn,
            "config": self.config,
            "package": self.package,
            "instanceId": self.instance_id,
            "authData": self.auth_data,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionChange:
        """The change ``to_json`` wrote; KeyError or TypeError when it is malformed."""
        if data["op"] not in _OPERATIONS or not isinstance(data["fqfn"], str):
            raise TypeError(f"unknown operation {data['op']!r} or malformed fqfn")
        instance_id = data.get("instanceId")
        if instance_id is not None and (
            not isinstance(instance_id, int) or isinstance(instance_id, bool)
        ):
            raise TypeError(f"instanceId must be a whole number, not {instance_id!r}")
        return cls(
            data["op"],
            data["fqfn"],
            data.get("config"),
            data.get("package"),
            data.get("instanceId"),
            data.get("authData"),
        )

    @property
    def name(self) -> str:
        """The function's name, as Pulsar's messages say it."""
        return self.fqfn.rsplit("/", 1)[-1]

    def apply(self, current: FunctionRecord | None) -> FunctionRecord | None:
        """The new record (None: deleted); raises, with Apache Pulsar's status and reason,
        when the change does not fit ``current``."""
        if self.op == "register":
            if current is not None:
                raise FunctionExistsError(f"Function {self.name} already exists")
            assert self.config is not None
            return FunctionRecord(self.fqfn, self.config, self.package, auth_data=self.auth_data)
        if current is None:
            # Pulsar answers an update of a missing function with 400, the rest with 404.
            status = 400 if self.op == "update" else 404
            raise FunctionNotFoundError(f"Function {self.name} doesn't exist", status)
        if self.op == "update":
            assert self.config is not None
            parallelism = FunctionConfig.parse(self.config).parallelism
            stopped = frozenset(i for i in current.stopped if i < parallelism)
            return replace(
                current,
                config=self.config,
                package=self.package or current.package,
                stopped=stopped,
                auth_data=self.auth_data or current.auth_data,
            )
        if self.op == "delete":
            return None
        parallelism = current.function_config().parallelism
        ids = range(parallelism) if self.instance_id is None else [self.instance_id]
        stopping = self.op == "stop"
        # As Pulsar's canChangeState: an instance out of range, or a change that changes
        # nothing, is not permitted.
        in_range = self.instance_id is None or 0 <= self.instance_id < parallelism
        if not in_range or all((i in current.stopped) == stopping for i in ids):
            raise RequestRefusedError("Operation not permitted")
        stopped = (current.stopped | set(ids)) if stopping else (current.stopped - set(ids))
        return replace(current, stopped=frozenset(stopped))


class FunctionManager:
    """Applies function changes through the leader and waits for them locally.

    ``namespace_check``, when given, runs on the leader before a registration is written
    (so a namespace deleted meanwhile cannot gain a function); without it the REST layer
    checks before submitting, as Apache Pulsar does. ``admission`` checks every register
    and update on the leader as it writes, whoever sent it."""

    def __init__(
        self,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        leader: LeaderService,
        timeout_s: float,
        http: httpx.Client,
        namespace_check: NamespaceCheck | None = None,
        admission: Admission | None = None,
        peer_seal: PeerSeal | None = None,
    ) -> None:
        """``http`` and ``peer_seal``: the client that forwards changes to the leader, and
        the seal that proves them a worker's."""
        self._metadata = metadata
        self._assignments = assignments
        self._leader = leader
        self._namespace_check = namespace_check
        self.admission = admission or Admission()
        self._channel = LeaderChannel(
            metadata, assignments, leader.worker_id, timeout_s, http, peer_seal
        )

    def submit(
        self, change: FunctionChange, authorization: str | None = None
    ) -> FunctionRecord | None:
        """Apply ``change`` on the leader (here or forwarded); return the applied record.

        ``authorization`` (the caller's Authorization header) goes along when the change is
        forwarded, so the leader checks the same credentials."""
        self._channel.submit(
            lambda: self._write(change),
            change.fqfn,
            FORWARD_PATH,
            change.to_json(),
            authorization,
        )
        return self._metadata.get(change.fqfn)

    def apply_forwarded(self, change: FunctionChange) -> int:
        """On the leader: apply a change another worker forwarded; the new version."""
        self._write(change)
        return self._metadata.version_of(change.fqfn)

    def check_capacity(self, fqfn: str, parallelism: int) -> None:
        """Refuse (AdmissionError) a ``parallelism`` for ``fqfn`` the cluster cannot hold, as
        this worker sees the functions and the live workers."""
        self.admission.check_capacity(
            fqfn, parallelism, self._metadata.get(fqfn), self._metadata.functions(), self._workers()
        )

    def _workers(self) -> int:
        """The live workers, as the leader last published them."""
        current = self._assignments.current
        return len(current.workers) if current is not None else 1

    def _write(self, change: FunctionChange) -> None:
        check = self._namespace_check

        def apply(current: FunctionRecord | None) -> FunctionRecord | None:
            # (a register of an existing function, an update of a missing one: Pulsar's
            # refusals come first)
            changes_config = change.op in ("register", "update")
            if changes_config and (change.op == "register") == (current is None):
                self.admission.check_change(
                    change.fqfn,
                    change.config,
                    change.package,
                    current,
                    self._metadata.functions(),
                    self._workers(),
                )
            elif change.op in ("start", "stop") and current is not None:
                self.admission.scheduled_parallelism(current)
            if check is not None and change.op == "register":
                tenant, namespace, _ = change.fqfn.split("/")
                check(tenant, namespace)
            return change.apply(current)

        self._leader.write_function(change.fqfn, apply)
