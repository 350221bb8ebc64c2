"""The vocabulary the worker's managers share: instance keys, workers, assignments, reports."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Assignment", "WorkerInfo", "WorkerReport", "instance_key", "parse_instance_key"]

Assignment = dict[str, str]
"""Instance key (``tenant/namespace/name:instance_id``) -> worker id."""


def instance_key(fqfn: str, instance_id: int) -> str:
    """``public/default/fn:0``: how an instance is named in assignments."""
    return f"{fqfn}:{instance_id}"


def parse_instance_key(key: str) -> tuple[str, int]:
    """``public/default/fn:0`` -> (``public/default/fn``, 0)."""
    fqfn, _, instance_id = key.rpartition(":")
    return fqfn, int(instance_id)


@dataclass(frozen=True)
class WorkerInfo:
    """A live member of the cluster, as its heartbeats describe it."""

    worker_id: str
    """Unique id of the worker."""
    admin_url: str
    """Base URL of its REST admin API."""


@dataclass(frozen=True)
class WorkerReport:
    """What a worker tells the leader in its heartbeats about the instances it runs."""

    assignment: tuple[int, int] | None
    """(term, version) of the assignment the worker has applied; None before any."""
    starting: frozenset[str] = frozenset()
    """Instances that assignment gives the worker which do not run yet (starting, or
    failing to start)."""
