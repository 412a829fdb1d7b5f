"""The static group partitions (loadtest/shared_prefix/partition.py): pure logic."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from loadtest.shared_prefix import hard_runner, partition, policies, runner
from loadtest.shared_prefix.hard_workloads import HARD_PROFILES as PROFILES


def _spread(loads: list[int]) -> int:
    return max(loads) - min(loads)


def test_first_seen_deals_groups_round_robin_in_arrival_order() -> None:
    assert partition.first_seen([7, 3, 7, 9, 1, 3, 5], 3) == {7: 0, 3: 1, 9: 2, 1: 0, 5: 1}


def test_swaps_keep_each_engines_group_count_and_even_the_loads() -> None:
    engine_of = {0: 0, 1: 1, 2: 0, 3: 1}
    weight = {0: 10, 1: 1, 2: 9, 3: 2}  # engine 0 has 19, engine 1 has 3
    out = partition.balance_by_swaps(engine_of, weight, 2)
    assert Counter(out.values()) == Counter(engine_of.values())
    assert partition.engine_loads(out, weight, 2) == [11, 11]
    assert engine_of == {0: 0, 1: 1, 2: 0, 3: 1}  # the input map is left as it was


def test_swaps_never_widen_the_spread() -> None:
    engine_of = {g: g % 3 for g in range(9)}
    weight = {g: 5 for g in range(9)}  # already even: nothing to gain
    assert partition.balance_by_swaps(engine_of, weight, 3) == engine_of


@pytest.mark.parametrize("seed", [1, 4, 6])
def test_hindsight_evens_the_burst_that_first_seen_leaves_uneven(seed: int) -> None:
    spec = replace(PROFILES["bursts"], seed=seed, capacity=150.0)
    plan = spec.plan()
    lo, hi = partition.window(spec, plan)
    assert (lo, hi) == (2.0, 3.5)
    weight = Counter(r.group for s, turns in zip(plan.starts, plan.sessions)
                     for r in turns if lo <= s < hi)
    first = partition.partition(partition.FIRST_SEEN, spec, plan, 3)
    hind = partition.partition(partition.HINDSIGHT, spec, plan, 3)
    assert set(first) == set(hind) == {r.group for r in plan.requests}
    assert sorted(Counter(first.values()).values()) == [10, 11, 11]
    assert Counter(hind.values()) == Counter(first.values())
    before = _spread(partition.engine_loads(first, weight, 3))
    after = _spread(partition.engine_loads(hind, weight, 3))
    assert before >= 8 and after <= 2, (before, after)


def test_every_group_of_a_multiturn_plan_is_mapped() -> None:
    spec = replace(PROFILES["multiturn"], seed=2)
    plan = spec.plan()
    m = partition.partition(partition.HINDSIGHT, spec, plan, 3)
    assert set(m) == {r.group for r in plan.requests}  # later turns' groups too
    chooser = partition.GroupMap(m)
    assert {chooser.choose(r) for r in plan.requests} == {0, 1, 2}


def test_unknown_partition_is_refused() -> None:
    spec = replace(PROFILES["bursts"], seed=1)
    with pytest.raises(ValueError, match="unknown partition 'nope'"):
        partition.partition("nope", spec, spec.plan(), 3)


def test_partitions_run_on_the_hard_workloads_only() -> None:
    pol = policies.get("partition-hindsight")
    assert pol.kind == "partition" and pol.partition == partition.HINDSIGHT
    assert policies.get("partition-first-seen").partition == partition.FIRST_SEEN
    assert hard_runner._refuse(pol) is None
    assert runner._refuse(pol) == "defined for the hard workloads only"
    assert runner._refuse(policies.get("best")) is None
    assert hard_runner._refuse(policies.get(policies.GREEDY)) is not None
