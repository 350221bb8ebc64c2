"""The schedulers: concrete placements, then properties over generated clusters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.worker.model import Assignment, instance_key
from magnetar.worker.scheduler import (
    SCHEDULERS,
    LeastLoadedStickyScheduler,
    RoundRobinScheduler,
    Scheduler,
    make_scheduler,
)

WORKER_POOL = ["w0", "w1", "w2", "w3", "w4", "w5", "w6"]
BOTH = [RoundRobinScheduler(), LeastLoadedStickyScheduler()]
least_loaded = LeastLoadedStickyScheduler()
round_robin = RoundRobinScheduler()


def fleet(functions: Mapping[str, int]) -> list[str]:
    """Instance keys of ``{function name: parallelism}`` in the default namespace."""
    return [
        instance_key(f"public/default/{name}", i)
        for name, parallelism in functions.items()
        for i in range(parallelism)
    ]


def loads(assignment: Assignment, workers: Sequence[str]) -> list[int]:
    counts = Counter(assignment.values())
    return [counts[worker] for worker in workers]


def is_balanced(assignment: Assignment, workers: Sequence[str]) -> bool:
    per_worker = loads(assignment, workers)
    return max(per_worker) - min(per_worker) <= 1


def moved(before: Mapping[str, str], after: Assignment) -> set[str]:
    """Instances that ran on some worker before and run on another one now."""
    return {key for key, worker in after.items() if key in before and before[key] != worker}


def minimum_moves(kept_loads: Sequence[int], orphans: int) -> int:
    """Fewest kept instances to move so that all loads differ by at most one.

    ``orphans`` more instances must be placed anyway (they cost no move). With ``total``
    instances over ``n`` workers a balanced assignment has ``extra = total % n`` workers at
    ``share + 1`` and the rest at ``share``. Every instance above ``share + 1`` moves; of
    the workers holding ``share + 1`` or more, at most ``extra`` keep that many, the
    others give up one more each.
    """
    share, extra = divmod(sum(kept_loads) + orphans, len(kept_loads))
    over = [load for load in kept_loads if load > share]
    return sum(load - share - 1 for load in over) + max(0, len(over) - extra)


# -- concrete examples ---------------------------------------------------------------


def test_round_robin_deals_instances_in_turn_over_sorted_workers() -> None:
    result = round_robin.schedule(fleet({"f": 2, "g": 2}), {}, ["w2", "w0", "w1"])

    assert result == {
        "public/default/f:0": "w0",
        "public/default/f:1": "w1",
        "public/default/g:0": "w2",
        "public/default/g:1": "w0",
    }


def test_round_robin_keeps_placed_instances_and_continues_the_rotation() -> None:
    current = {"public/default/f:0": "w0", "public/default/f:1": "w1"}

    result = round_robin.schedule(fleet({"f": 2, "g": 2}), current, ["w0", "w1", "w2"])

    assert result == current | {"public/default/g:0": "w2", "public/default/g:1": "w0"}


def test_round_robin_rebalance_deals_everything_again() -> None:
    current = dict.fromkeys(fleet({"f": 4}), "w1")

    result = round_robin.schedule(fleet({"f": 4}), current, ["w0", "w1"], rebalance=True)

    assert list(result.values()) == ["w0", "w1", "w0", "w1"]


def test_least_loaded_spreads_a_new_function_over_the_workers() -> None:
    result = least_loaded.schedule(fleet({"f": 3, "g": 3}), {}, ["w0", "w1", "w2"])

    assert loads(result, ["w0", "w1", "w2"]) == [2, 2, 2]
    assert {result[key] for key in fleet({"f": 3})} == {"w0", "w1", "w2"}
    assert {result[key] for key in fleet({"g": 3})} == {"w0", "w1", "w2"}


def test_least_loaded_breaks_a_tie_away_from_workers_running_the_function() -> None:
    # w0 and w1 carry one instance each; f already runs on w0, so its new instance goes
    # to w1 although w0 has the lower id. g:1 then goes to the now less-loaded w0.
    current = {"public/default/f:0": "w0", "public/default/g:0": "w1"}

    result = least_loaded.schedule(fleet({"f": 2, "g": 2}), current, ["w0", "w1"])

    assert result == current | {"public/default/f:1": "w1", "public/default/g:1": "w0"}


def test_least_loaded_moves_only_the_instances_of_a_worker_that_left() -> None:
    instances = fleet({"f": 4, "g": 4, "h": 4})
    before = least_loaded.schedule(instances, {}, ["w0", "w1", "w2", "w3"])

    after = least_loaded.schedule(instances, before, ["w0", "w1", "w3"])

    gone = {key for key, worker in before.items() if worker == "w2"}
    assert moved(before, after) == gone
    assert loads(after, ["w0", "w1", "w3"]) == [4, 4, 4]


def test_least_loaded_gives_a_joining_worker_its_share_one_instance_per_function_at_a_time() -> (
    None
):
    instances = fleet({"f": 4, "g": 4})
    before = least_loaded.schedule(instances, {}, ["w0", "w1"])
    grown = ["w0", "w1", "w2"]

    first = least_loaded.schedule(instances, before, grown)

    assert loads(first, grown) == [3, 3, 2]
    assert {first[key] for key in moved(before, first)} == {"w2"}
    assert sorted(key.rpartition(":")[0] for key in moved(before, first)) == [
        "public/default/f",
        "public/default/g",
    ]
    assert least_loaded.schedule(instances, first, grown) == first


def test_least_loaded_moves_nothing_of_a_function_whose_instances_are_unsettled() -> None:
    instances = fleet({"f": 4})
    before = dict.fromkeys(instances, "w0")

    waiting = least_loaded.schedule(
        instances, before, ["w0", "w1"], unsettled=["public/default/f:0"]
    )
    first = least_loaded.schedule(instances, before, ["w0", "w1"])
    still_starting = least_loaded.schedule(
        instances, first, ["w0", "w1"], unsettled=moved(before, first)
    )
    second = least_loaded.schedule(instances, first, ["w0", "w1"])

    assert waiting == before
    assert moved(before, first) == {"public/default/f:3"}  # one at a time: f keeps running
    assert still_starting == first
    assert moved(before, second) == {"public/default/f:3", "public/default/f:2"}
    assert loads(second, ["w0", "w1"]) == [2, 2]


def test_least_loaded_evens_out_what_a_leader_placed_on_the_workers_it_knew() -> None:
    # A new leader heard only from w0 in time: everything landed there; w1 and w2 are back.
    instances = fleet({"f": 4, "g": 4})
    crowded = dict.fromkeys(instances, "w0")
    workers = ["w0", "w1", "w2"]

    steps, current = 0, crowded
    while (following := least_loaded.schedule(instances, current, workers)) != current:
        current, steps = following, steps + 1

    assert loads(current, workers) == [3, 3, 2]
    assert len(moved(crowded, current)) == minimum_moves(loads(crowded, workers), 0) == 5
    assert steps == 3  # at most one instance of f and one of g per step


def test_least_loaded_rebalance_moves_the_highest_keys_of_the_busiest_workers() -> None:
    current = {
        **dict.fromkeys(fleet({"a": 4}), "w0"),
        **dict.fromkeys(fleet({"b": 2}), "w1"),
    }

    result = least_loaded.schedule(list(current), current, ["w0", "w1", "w2"], rebalance=True)

    assert moved(current, result) == {"public/default/a:2", "public/default/a:3"}
    assert result["public/default/a:2"] == result["public/default/a:3"] == "w2"
    assert loads(result, ["w0", "w1", "w2"]) == [2, 2, 2]


def test_least_loaded_rebalance_of_a_balanced_assignment_moves_nothing() -> None:
    instances = fleet({"f": 5, "g": 2})
    before = least_loaded.schedule(instances, {}, ["w0", "w1", "w2"])

    assert least_loaded.schedule(instances, before, ["w0", "w1", "w2"], rebalance=True) == before


@pytest.mark.parametrize("scheduler", BOTH, ids=lambda scheduler: type(scheduler).__name__)
def test_no_workers_means_nothing_is_assigned(scheduler: Scheduler) -> None:
    current = {"public/default/f:0": "w0"}

    assert scheduler.schedule(fleet({"f": 2}), current, []) == {}
    assert scheduler.schedule(fleet({"f": 2}), current, [], rebalance=True) == {}


@pytest.mark.parametrize("scheduler", BOTH, ids=lambda scheduler: type(scheduler).__name__)
def test_instances_no_longer_desired_are_dropped(scheduler: Scheduler) -> None:
    current = {"public/default/f:0": "w0", "public/default/deleted:0": "w1"}

    assert scheduler.schedule(["public/default/f:0"], current, ["w0", "w1"]) == {
        "public/default/f:0": "w0"
    }


def test_ten_thousand_instances_rebalance_onto_a_joining_worker() -> None:
    instances = fleet({f"fn{i:04d}": 10 for i in range(1_000)})
    workers = [f"worker-{i}" for i in range(10)]
    before = least_loaded.schedule(instances, {}, workers)

    after = least_loaded.schedule(instances, before, [*workers, "worker-new"], rebalance=True)

    assert is_balanced(after, [*workers, "worker-new"])
    assert len(moved(before, after)) == minimum_moves([*loads(before, workers), 0], 0) == 909
    assert {after[key] for key in moved(before, after)} == {"worker-new"}


def test_make_scheduler_builds_each_named_scheduler() -> None:
    assert isinstance(make_scheduler("round-robin"), RoundRobinScheduler)
    assert isinstance(make_scheduler("least-loaded-sticky"), LeastLoadedStickyScheduler)
    assert set(SCHEDULERS) == {"round-robin", "least-loaded-sticky"}


def test_make_scheduler_names_the_choices_for_an_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown scheduler 'fastest'") as error:
        make_scheduler("fastest")

    assert "'least-loaded-sticky', 'round-robin'" in str(error.value)


# -- properties ----------------------------------------------------------------------

function_fleets = st.dictionaries(
    st.text(alphabet="abcd", min_size=1, max_size=3), st.integers(1, 6), max_size=8
).map(fleet)
live_workers = st.lists(st.sampled_from(WORKER_POOL), min_size=1, max_size=6, unique=True)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[str], dict[str, str], list[str]]:
    """Desired instances, a current assignment (partial, with stale instances and dead
    workers) and the live workers."""
    instances = draw(function_fleets)
    stale = draw(st.lists(st.sampled_from(fleet({"gone": 3})), unique=True))
    placed = draw(st.lists(st.sampled_from(instances), unique=True)) if instances else []
    current = {key: draw(st.sampled_from(WORKER_POOL)) for key in placed + stale}
    return instances, current, draw(live_workers)


schedulers = st.sampled_from(BOTH)
fast = settings(max_examples=150, deadline=None)


@fast
@given(schedulers, clusters(), st.booleans())
def test_every_desired_instance_and_nothing_else_lands_on_a_live_worker(
    scheduler: Scheduler,
    cluster: tuple[list[str], dict[str, str], list[str]],
    rebalance: bool,
) -> None:
    instances, current, workers = cluster

    result = scheduler.schedule(instances, current, workers, rebalance=rebalance)

    assert set(result) == set(instances)
    assert set(result.values()) <= set(workers)


@fast
@given(clusters())
def test_round_robin_keeps_instances_on_live_workers(
    cluster: tuple[list[str], dict[str, str], list[str]],
) -> None:
    instances, current, workers = cluster

    result = round_robin.schedule(instances, current, workers)

    assert not moved({k: w for k, w in current.items() if w in workers}, result)
    assert round_robin.schedule(instances, result, workers) == result


@fast
@given(clusters(), st.data())
def test_least_loaded_steps_reach_balance_moving_each_instance_at_most_once(
    cluster: tuple[list[str], dict[str, str], list[str]], data: st.DataObject
) -> None:
    instances, current, workers = cluster
    kept = {key: current[key] for key in instances if current.get(key) in workers}
    moves, result = 0, dict(current)
    for _ in range(4):
        # some instances (those just moved, or any other) may not be running yet
        unsettled = data.draw(st.sets(st.sampled_from(sorted(instances)))) if instances else set()
        following = least_loaded.schedule(instances, result, workers, unsettled=unsettled)
        step = moved({k: w for k, w in result.items() if w in workers}, following)
        functions = [key.rpartition(":")[0] for key in step]
        assert len(functions) == len(set(functions))  # one instance of a function per step
        assert not {key.rpartition(":")[0] for key in unsettled} & set(functions)
        moves, result = moves + len(step), following
    while (following := least_loaded.schedule(instances, result, workers)) != result:
        moves += len(moved(result, following))
        result = following

    assert is_balanced(result, workers) or not instances
    # every move is one the balanced assignment needs: no instance moves twice
    assert moves == minimum_moves(loads(kept, workers), len(instances) - len(kept))


@fast
@given(schedulers, function_fleets, function_fleets, live_workers)
def test_adding_instances_moves_none_of_the_old_ones(
    scheduler: Scheduler, old: list[str], new: list[str], workers: list[str]
) -> None:
    before = scheduler.schedule(old, {}, workers)

    after = scheduler.schedule(sorted(set(old + new)), before, workers)

    assert not moved(before, after)


@fast
@given(schedulers, function_fleets, live_workers.filter(lambda ws: len(ws) > 1), st.data())
def test_a_leaving_worker_moves_only_its_instances(
    scheduler: Scheduler, instances: list[str], workers: list[str], data: st.DataObject
) -> None:
    before = scheduler.schedule(instances, {}, workers)
    leaving = data.draw(st.sampled_from(workers))
    remaining = [worker for worker in workers if worker != leaving]

    after = scheduler.schedule(instances, before, remaining)

    assert moved(before, after) == {key for key, worker in before.items() if worker == leaving}
    if instances and isinstance(scheduler, LeastLoadedStickyScheduler):
        assert is_balanced(after, remaining)


@fast
@given(function_fleets.filter(bool), live_workers)
def test_least_loaded_from_empty_is_balanced_and_spreads_functions(
    instances: list[str], workers: list[str]
) -> None:
    result = least_loaded.schedule(instances, {}, workers)

    assert is_balanced(result, workers)
    for name in {key.rpartition(":")[0] for key in instances}:
        hosts = Counter(w for k, w in result.items() if k.rpartition(":")[0] == name)
        # A function never doubles up on a worker while another one lacks it.
        assert len(hosts) == len(workers) or max(hosts.values()) == 1


@fast
@given(clusters().filter(lambda cluster: bool(cluster[0])))
def test_least_loaded_rebalance_evens_the_load_with_the_fewest_moves(
    cluster: tuple[list[str], dict[str, str], list[str]],
) -> None:
    instances, current, workers = cluster
    kept = {key: current[key] for key in instances if current.get(key) in workers}

    result = least_loaded.schedule(instances, current, workers, rebalance=True)

    assert is_balanced(result, workers)
    assert len(moved(kept, result)) == minimum_moves(
        loads(kept, workers), len(instances) - len(kept)
    )


@fast
@given(function_fleets.filter(bool), live_workers, st.sampled_from(WORKER_POOL))
def test_rebalance_after_a_worker_joins_moves_the_fewest_instances(
    instances: list[str], workers: list[str], joining: str
) -> None:
    before = least_loaded.schedule(instances, {}, workers)
    grown = sorted({*workers, joining})

    after = least_loaded.schedule(instances, before, grown, rebalance=True)

    assert is_balanced(after, grown)
    assert len(moved(before, after)) == minimum_moves(loads(before, grown), 0)


@fast
@given(schedulers, clusters(), st.booleans(), st.randoms(use_true_random=False))
def test_shuffled_input_gives_the_identical_assignment(
    scheduler: Scheduler,
    cluster: tuple[list[str], dict[str, str], list[str]],
    rebalance: bool,
    rng: Random,
) -> None:
    instances, current, workers = cluster
    shuffled_instances, shuffled_workers = list(instances), list(workers)
    shuffled_current = list(current.items())
    for items in (shuffled_instances, shuffled_workers, shuffled_current):
        rng.shuffle(items)

    expected = scheduler.schedule(instances, current, workers, rebalance=rebalance)
    result = scheduler.schedule(
        shuffled_instances + shuffled_instances[:2],
        dict(shuffled_current),
        shuffled_workers,
        rebalance=rebalance,
    )

    assert list(result.items()) == list(expected.items())
