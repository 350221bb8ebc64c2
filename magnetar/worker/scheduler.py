"""Schedulers: which live worker runs each function instance (DESIGN §4).

A scheduler is a pure function of its inputs: no state, no I/O, no clock. The leader calls
it with the desired instances, the assignment in force and the live workers, and writes
the result as the next assignment. The same input always gives the same output, whatever
the iteration order of the collections passed in, so a new leader recomputing an
assignment from the same view reaches the same answer.

Two schedulers, chosen by name with :func:`make_scheduler`:

* ``round-robin`` (:class:`RoundRobinScheduler`): keeps placed instances, deals out the
  others in turn over the workers sorted by id.
* ``least-loaded-sticky`` (:class:`LeastLoadedStickyScheduler`, the default): keeps placed
  instances, puts each other one on the least-loaded worker, and evens the loads on its own
  (a worker that joins gets its share) by moving the fewest instances, a few at a time.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from magnetar.worker.model import Assignment, parse_instance_key

__all__ = [
    "SCHEDULERS",
    "LeastLoadedStickyScheduler",
    "RoundRobinScheduler",
    "Scheduler",
    "make_scheduler",
]


class Scheduler(Protocol):
    """Decides the next assignment; the leader's only view of scheduling policy."""

    def schedule(
        self,
        instances: Sequence[str],
        current: Mapping[str, str],
        workers: Sequence[str],
        *,
        rebalance: bool = False,
        unsettled: Collection[str] = (),
    ) -> Assignment:
        """Return the assignment of exactly ``instances``, each to one of ``workers``.

        Args:
            instances: Keys of every instance that must run (``tenant/ns/name:3``);
                duplicates count once.
            current: The assignment in force. Entries for instances no longer desired or
                for workers no longer live are ignored.
            workers: Ids of the live workers that may take instances (draining workers
                already removed); duplicates count once.
            rebalance: Even the load now, in one go (the explicit rebalance operation).
            unsettled: Instances not running yet where ``current`` puts them (just moved,
                or still starting). A scheduler that evens the load on its own leaves
                their functions where they are until they run.

        Returns:
            A new assignment in instance-key order. Empty when ``workers`` is empty:
            with no worker nothing can run, and the instances stay unassigned until one
            joins.
        """
        ...


class RoundRobinScheduler:
    """Deals instances out in turn over the workers sorted by id.

    Without rebalance, an instance already on a live worker stays there, and the
    unplaced instances (new ones, or those of a worker that left), in key order,
    continue the rotation where dealing the kept instances would have stopped: the
    first goes to worker number ``len(kept) % len(workers)``. With rebalance, every
    instance is dealt out again from the first worker.

    Apache Pulsar's scheduler of the same name sends each unplaced instance to the
    worker with the fewest instances; this one rotates strictly, as its name says.
    """

    def schedule(
        self,
        instances: Sequence[str],
        current: Mapping[str, str],
        workers: Sequence[str],
        *,
        rebalance: bool = False,
        unsettled: Collection[str] = (),
    ) -> Assignment:
        """See :meth:`Scheduler.schedule`; ``unsettled`` plays no part."""
        keys, ids = _sorted_unique(instances), _sorted_unique(workers)
        if not ids:
            return {}
        if rebalance:
            return {key: ids[turn % len(ids)] for turn, key in enumerate(keys)}
        assignment, unplaced = _split(keys, current, set(ids))
        for turn, key in enumerate(unplaced, start=len(assignment)):
            assignment[key] = ids[turn % len(ids)]
        return _in_key_order(assignment, keys)


class LeastLoadedStickyScheduler:
    """Keeps instances where they run; balances load while moving as few as possible.

    An instance already on a live worker stays there unless the loads need evening, and each
    unplaced instance, in key order, goes to the worker with the fewest instances. Ties go
    to the worker running fewer instances of the same function (so a function's instances
    spread over workers and survive the loss of one), then to the lowest id. Starting from a
    balanced assignment (loads differ by at most one), losing a worker or adding instances
    leaves it balanced.

    When the loads differ by more than one (a worker joined, or a new leader placed
    instances while it knew only some of the workers), each call also moves some of the
    fewest instances that even them: from the workers above their share to the least-loaded
    ones below it, taking the instances of the functions the donor runs most of. So that no
    function stops while its instances move, one call moves at most one instance of each
    function, and none of a function that has an ``unsettled`` instance or an instance just
    placed; the leader calls again once they run. Every instance moves at most once on the
    way to the balanced assignment. With ``rebalance``, all those moves happen in one call.
    """

    def schedule(
        self,
        instances: Sequence[str],
        current: Mapping[str, str],
        workers: Sequence[str],
        *,
        rebalance: bool = False,
        unsettled: Collection[str] = (),
    ) -> Assignment:
        """See :meth:`Scheduler.schedule`."""
        keys, ids = _sorted_unique(instances), _sorted_unique(workers)
        if not ids:
            return {}
        assignment, unplaced = _split(keys, current, set(ids))
        if unplaced:
            _place(unplaced, assignment, ids)
        if rebalance:
            _balance(assignment, ids)
        else:
            busy = {_fqfn(key) for key in (*unplaced, *unsettled)}
            _balance(assignment, ids, _Step(busy))
        return _in_key_order(assignment, keys)


SCHEDULERS: Mapping[str, type[Scheduler]] = {
    "round-robin": RoundRobinScheduler,
    "least-loaded-sticky": LeastLoadedStickyScheduler,
}
"""The schedulers a worker can be configured with, by name."""


def make_scheduler(name: str) -> Scheduler:
    """The scheduler called ``name``; a ``ValueError`` naming the choices if none is."""
    try:
        scheduler = SCHEDULERS[name]
    except KeyError:
        choices = ", ".join(repr(known) for known in sorted(SCHEDULERS))
        raise ValueError(f"unknown scheduler {name!r}: choose one of {choices}") from None
    return scheduler()


def _sorted_unique(items: Iterable[str]) -> list[str]:
    return sorted(set(items))


def _split(
    keys: Sequence[str], current: Mapping[str, str], live: set[str]
) -> tuple[Assignment, list[str]]:
    """The instances staying on their live worker, and those that need a worker."""
    kept: Assignment = {}
    unplaced: list[str] = []
    for key in keys:
        worker = current.get(key)
        if worker is not None and worker in live:
            kept[key] = worker
        else:
            unplaced.append(key)
    return kept, unplaced


def _in_key_order(assignment: Assignment, keys: Sequence[str]) -> Assignment:
    # A fixed order makes the serialized assignment record identical for identical input.
    return {key: assignment[key] for key in keys}


def _fqfn(key: str) -> str:
    return parse_instance_key(key)[0]


def _place(keys: Iterable[str], assignment: Assignment, candidates: Iterable[str]) -> None:
    """Assign each key, in order, to the least-loaded of the ``candidates`` workers.

    Their loads are counted from ``assignment``, which may also hold other workers.
    """
    loads = dict.fromkeys(candidates, 0)
    per_function: Counter[tuple[str, str]] = Counter()
    for key, worker in assignment.items():
        if worker in loads:
            loads[worker] += 1
            per_function[worker, _fqfn(key)] += 1
    placer = _Placer(loads, per_function)
    for key in keys:
        assignment[key] = placer.place(key)


class _Placer:
    """Finds the least-loaded worker in O(log workers) with a heap of (load, worker id).

    Loads only grow while placing, and only through :meth:`place`, so the heap never
    holds a stale entry.
    """

    def __init__(self, loads: Mapping[str, int], per_function: Counter[tuple[str, str]]):
        self._heap = [(load, worker) for worker, load in loads.items()]
        heapq.heapify(self._heap)
        self._per_function = per_function

    def place(self, key: str) -> str:
        """The worker for ``key``: fewest instances, then fewest of its function, then id."""
        fqfn = _fqfn(key)
        tied = [heapq.heappop(self._heap)]
        load = tied[0][0]
        # Equal loads pop in id order; look further only while the candidate already runs
        # this function, so the common case costs one pop.
        while self._per_function[tied[-1][1], fqfn] and self._heap and self._heap[0][0] == load:
            tied.append(heapq.heappop(self._heap))
        chosen = min(tied, key=lambda entry: (self._per_function[entry[1], fqfn], entry[1]))
        worker = chosen[1]
        for entry in tied:
            if entry[1] != worker:
                heapq.heappush(self._heap, entry)
        heapq.heappush(self._heap, (load + 1, worker))
        self._per_function[worker, fqfn] += 1
        return worker


@dataclass
class _Step:
    """The limits of one automatic balancing step: one instance per function, and none of
    the ``busy`` functions (instances starting or just placed)."""

    busy: set[str]

    def allows(self, fqfn: str) -> bool:
        return fqfn not in self.busy

    def take(self, fqfn: str) -> None:
        self.busy.add(fqfn)


def _balance(assignment: Assignment, ids: Sequence[str], step: _Step | None = None) -> None:
    """Move the fewest instances that make the loads of ``ids`` differ by at most one (with
    a ``step``, only those of them it allows)."""
    by_worker: dict[str, list[str]] = {worker: [] for worker in ids}
    for key, worker in assignment.items():
        by_worker[worker].append(key)
    targets = _targets({worker: len(keys) for worker, keys in by_worker.items()})
    moving: list[str] = []
    for worker in ids:
        surplus = len(by_worker[worker]) - targets[worker]
        if surplus > 0:
            moving.extend(_donations(by_worker[worker], surplus, step))
    if not moving:
        return
    for key in moving:
        del assignment[key]
    # Donors are at or above their target now; filling the receivers from the least loaded
    # keeps every move one that a balanced assignment needs, so each instance moves once.
    receivers = [worker for worker in ids if len(by_worker[worker]) < targets[worker]]
    _place(sorted(moving), assignment, receivers)


def _donations(keys: Sequence[str], surplus: int, step: _Step | None) -> list[str]:
    """Up to ``surplus`` of a donor's instances to move, each time one of the function it
    still runs most of (so the donor keeps a spread of functions), its highest instance id
    first; with a ``step``, only what the step allows."""
    by_function: dict[str, list[str]] = {}
    for key in sorted(keys, key=lambda key: parse_instance_key(key)[1]):
        by_function.setdefault(_fqfn(key), []).append(key)
    heap = [(-len(held), fqfn) for fqfn, held in by_function.items()]
    heapq.heapify(heap)
    chosen: list[str] = []
    while heap and len(chosen) < surplus:
        _, fqfn = heapq.heappop(heap)
        if step is not None:
            if not step.allows(fqfn):
                continue
            step.take(fqfn)
        held = by_function[fqfn]
        chosen.append(held.pop())
        if held and step is None:
            heapq.heappush(heap, (-len(held), fqfn))
    return chosen


def _targets(loads: Mapping[str, int]) -> dict[str, int]:
    """The balanced load of each worker that is nearest its current load.

    A balanced assignment of ``total`` instances over ``n`` workers gives ``total % n``
    workers one more than ``total // n``. Giving the extra one to the most-loaded workers
    (lowest id first on a tie) minimizes the sum of the surpluses, the number of moves.
    """
    share, extra = divmod(sum(loads.values()), len(loads))
    ranked = sorted(loads, key=lambda worker: (-loads[worker], worker))
    return {worker: share + (rank < extra) for rank, worker in enumerate(ranked)}
