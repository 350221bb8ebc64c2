"""The assignments topic: the leader publishes the whole assignment as one record; every
worker applies the newest record of the highest term and runs its share."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulsar

from magnetar.worker.cluster_key import RecordSeal
from magnetar.worker.model import Assignment, WorkerInfo
from magnetar.worker.tailer import ReplicatedState

__all__ = ["AssignmentManager", "AssignmentRecord"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AssignmentRecord:
    """Where every instance runs, as decided by the leader of ``term``."""

    term: int
    version: int
    leader: WorkerInfo
    workers: list[WorkerInfo] = field(default_factory=list)
    """The membership the leader saw."""
    assignment: Assignment = field(default_factory=dict)
    draining: list[str] = field(default_factory=list)
    """Workers that take no instances."""

    def newer_than(self, other: AssignmentRecord | None) -> bool:
        return other is None or (self.term, self.version) > (other.term, other.version)

    def to_json(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "version": self.version,
            "leader": {"workerId": self.leader.worker_id, "adminUrl": self.leader.admin_url},
            "workers": [{"workerId": w.worker_id, "adminUrl": w.admin_url} for w in self.workers],
            "assignment": dict(sorted(self.assignment.items())),
            "draining": sorted(self.draining),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AssignmentRecord:
        def worker(item: dict[str, str]) -> WorkerInfo:
            return WorkerInfo(item["workerId"], item["adminUrl"])

        return cls(
            term=int(data["term"]),
            version=int(data["version"]),
            leader=worker(data["leader"]),
            workers=[worker(w) for w in data.get("workers", [])],
            assignment=dict(data.get("assignment", {})),
            draining=list(data.get("draining", [])),
        )


class AssignmentManager(ReplicatedState):
    """Replays the assignments topic and keeps the record in force."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        on_change: Callable[[AssignmentRecord], None] | None = None,
        seal: RecordSeal | None = None,
    ) -> None:
        super().__init__(client, topic, "assignments", seal)
        self._on_change = on_change
        self._current: AssignmentRecord | None = None
        self._lock = threading.Lock()

    @property
    def current(self) -> AssignmentRecord | None:
        with self._lock:
            return self._current

    def write(self, record: AssignmentRecord, timeout: float) -> None:
        """Publish ``record`` (leader only) and wait until it is applied here."""
        self._publish(json.dumps(record.to_json()).encode(), {"term": str(record.term)}, timeout)

    def _apply(self, message: Any) -> None:
        try:
            record = AssignmentRecord.from_json(json.loads(message.data()))
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring a malformed assignment record: %s", error)
            return
        with self._lock:
            current = self._current
            rival = (
                current is not None
                and record.term == current.term
                and record.leader.worker_id != current.leader.worker_id
            )
            if rival or not record.newer_than(current):
                if current is not None and (rival or record.term < current.term):
                    log.info(
                        "ignoring an assignment of %s for term %d",
                        record.leader.worker_id,
                        record.term,
                    )
                return
            self._current = record
        if self._on_change is not None:
            self._on_change(record)
