"""Function management as the REST API sees it: register, update, delete, start, stop.

A change is data (``FunctionChange``), so the same change runs on the leader whether it
arrived there directly or was forwarded by another worker. Every call returns only once
this worker has applied the change (read-your-writes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Literal

import httpx

from magnetar.instance.config import FunctionConfig
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.exceptions import (
    AuthenticationError,
    AuthorizationError,
    FunctionExistsError,
    FunctionNotFoundError,
    LeaderUnavailableError,
    NotLeaderError,
    ReplicationTimeoutError,
    WorkerError,
)
from magnetar.worker.leader import LeaderService
from magnetar.worker.metadata import FunctionRecord, MetadataManager

__all__ = ["FORWARD_PATH", "FunctionChange", "FunctionManager"]

log = logging.getLogger(__name__)

FORWARD_PATH = "/admin/v2/worker/internal/function-changes"

Operation = Literal["register", "update", "delete", "start", "stop"]


@dataclass(frozen=True)
class FunctionChange:
    """One change to one function, as sent to the leader."""

    op: Operation
    fqfn: str
    config: dict[str, Any] | None = None
    package: dict[str, Any] | None = None
    instance_id: int | None = None
    """For start/stop: one instance; None means all."""

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "fqfn": self.fqfn,
            "config": self.config,
            "package": self.package,
            "instanceId": self.instance_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionChange:
        return cls(
            data["op"],
            data["fqfn"],
            data.get("config"),
            data.get("package"),
            data.get("instanceId"),
        )

    def apply(self, current: FunctionRecord | None) -> FunctionRecord | None:
        """The new record (None: deleted); raises when the change does not fit ``current``."""
        if self.op == "register":
            if current is not None:
                raise FunctionExistsError(f"function {self.fqfn} already exists")
            assert self.config is not None
            return FunctionRecord(self.fqfn, self.config, self.package)
        if current is None:
            raise FunctionNotFoundError(f"function {self.fqfn} doesn't exist")
        if self.op == "update":
            assert self.config is not None
            parallelism = FunctionConfig.parse(self.config).parallelism
            stopped = frozenset(i for i in current.stopped if i < parallelism)
            return replace(
                current,
                config=self.config,
                package=self.package or current.package,
                stopped=stopped,
            )
        if self.op == "delete":
            return None
        parallelism = current.function_config().parallelism
        ids = range(parallelism) if self.instance_id is None else [self.instance_id]
        if self.instance_id is not None and not 0 <= self.instance_id < parallelism:
            raise FunctionNotFoundError(
                f"function {self.fqfn} has no instance {self.instance_id} "
                f"(parallelism {parallelism})"
            )
        stopped = (
            (current.stopped | set(ids)) if self.op == "stop" else (current.stopped - set(ids))
        )
        return replace(current, stopped=frozenset(stopped))


class FunctionManager:
    """Applies function changes through the leader and waits for them locally."""

    def __init__(
        self,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        leader: LeaderService,
        timeout_s: float,
        http: httpx.Client,
    ) -> None:
        """``http``: the client that forwards changes to the leader."""
        self._metadata = metadata
        self._assignments = assignments
        self._leader = leader
        self._timeout = timeout_s
        self._http = http

    def submit(
        self, change: FunctionChange, authorization: str | None = None
    ) -> FunctionRecord | None:
        """Apply ``change`` on the leader (here or forwarded); return the applied record.

        ``authorization`` (the caller's Authorization header) goes along when the change is
        forwarded, so the leader checks the same credentials."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                return self._leader.write_function(change.fqfn, change.apply)
            except NotLeaderError:
                current = self._assignments.current
                leads_elsewhere = current is not None and current.leader.worker_id != (
                    self._leader.worker_id
                )
                if leads_elsewhere or time.monotonic() > deadline:
                    break
                # This worker is the leader on record but still taking over: wait for it.
                time.sleep(0.1)
        version = self._forward(change, authorization)
        if not self._metadata.wait_for_version(change.fqfn, version, self._timeout):
            raise ReplicationTimeoutError(
                f"the change to {change.fqfn} was made but has not reached this worker "
                f"within {self._timeout:.0f}s"
            )
        return self._metadata.get(change.fqfn)

    def apply_forwarded(self, change: FunctionChange) -> int:
        """On the leader: apply a change another worker forwarded; the new version."""
        self._leader.write_function(change.fqfn, change.apply)
        return self._metadata.version_of(change.fqfn)

    def _forward(self, change: FunctionChange, authorization: str | None) -> int:
        current = self._assignments.current
        if current is None or current.leader.worker_id == "":
            raise LeaderUnavailableError("no leader is known yet; retry in a moment")
        url = current.leader.admin_url.rstrip("/") + FORWARD_PATH
        try:
            headers = {"Authorization": authorization} if authorization else {}
            response = self._http.post(
                url, json=change.to_json(), headers=headers, timeout=self._timeout
            )
        except httpx.HTTPError as error:
            raise LeaderUnavailableError(
                f"the leader {current.leader.worker_id} at {current.leader.admin_url} cannot "
                f"be reached: {error}"
            ) from None
        if response.status_code == 200:
            return int(response.json()["version"])
        reason = _reason(response)
        errors: dict[int, type[WorkerError]] = {
            401: AuthenticationError,
            403: AuthorizationError,
            404: FunctionNotFoundError,
            409: FunctionExistsError,
            503: LeaderUnavailableError,
        }
        raise errors.get(response.status_code, WorkerError)(reason)


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json()["reason"])
    except (ValueError, KeyError, TypeError):
        return f"the leader answered {response.status_code}: {response.text[:200]}"
