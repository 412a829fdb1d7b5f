"""Static group partitions: reference choosers for the hard workloads (issue 15).

Each prefix group is pinned to one engine and the client sends straight to it, no router.
Two maps, both with the group counts split as evenly as the engines allow (what
sglang-router's smallest-tree rule and `balanceMisses` aim at):
- `partition-first-seen`: groups dealt round-robin in the order they first arrive;
- `partition-hindsight`: the same counts, with groups swapped between engines until the
  requests each engine gets inside a window (the burst, for `bursts`) are as even as
  pairwise swaps make them. It reads the whole plan in advance, which no router can:
  it tells how much a placement by counts could gain, not what a router should do.
They are references, not ceilings: a router may also move requests between engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .client import Chooser
from .hard_workloads import BurstSpec, HardSpec, Plan

FIRST_SEEN = "first-seen"
HINDSIGHT = "hindsight"


class GroupMap(Chooser):
    """Sends every request of a group to the group's engine."""

    def __init__(self, engine_of: dict[int, int]) -> None:
        self.engine_of = engine_of

    def choose(self, req: Any) -> int:
        return self.engine_of[req.group]


def first_seen(groups_in_order: Sequence[int], n: int) -> dict[int, int]:
    """Groups dealt round-robin over `n` engines in the order they first appear."""
    order = list(dict.fromkeys(groups_in_order))
    return {g: i % n for i, g in enumerate(order)}


def engine_loads(engine_of: dict[int, int], weight: dict[int, int], n: int) -> list[int]:
    loads = [0] * n
    for g, e in engine_of.items():
        loads[e] += weight.get(g, 0)
    return loads


def balance_by_swaps(engine_of: dict[int, int], weight: dict[int, int], n: int) -> dict[int, int]:
    """Swaps pairs of groups on different engines while a swap narrows the spread
    (largest minus smallest engine load), so each engine keeps its number of groups.
    Local search: it stops at a swap-optimum, which need not be the best split."""
    out = dict(engine_of)

    def spread() -> int:
        loads = engine_loads(out, weight, n)
        return max(loads) - min(loads)

    best = spread()
    improved = True
    while improved and best > 0:
        improved = False
        for a in out:
            for b in out:
                if out[a] == out[b]:
                    continue
                out[a], out[b] = out[b], out[a]
                s = spread()
                if s < best:
                    best, improved = s, True
                else:
                    out[a], out[b] = out[b], out[a]
    return out


def window(spec: HardSpec, plan: Plan) -> tuple[float, float]:
    """The simulated seconds whose arrivals the hindsight split evens out: the 2x phase
    of `bursts`, the whole plan otherwise."""
    if isinstance(spec, BurstSpec):
        lo = spec.phases[0][0]
        return lo, lo + spec.phases[1][0]
    return 0.0, max(plan.starts, default=0.0) + 1.0


def partition(kind: str, spec: HardSpec, plan: Plan, n: int) -> dict[int, int]:
    """The group -> engine map of a reference kind. Groups are met in the order of their
    sessions' starts (open-loop profiles have one-request sessions), a session's turns in
    order: later turns' send times depend on the replies."""
    by_start = sorted(zip(plan.starts, range(len(plan.sessions))))
    engine_of = first_seen([r.group for _, i in by_start for r in plan.sessions[i]], n)
    if kind == FIRST_SEEN:
        return engine_of
    if kind != HINDSIGHT:
        raise ValueError(f"unknown partition {kind!r}")
    lo, hi = window(spec, plan)
    weight: dict[int, int] = {}
    for start, turns in zip(plan.starts, plan.sessions):
        if lo <= start < hi:
            for r in turns:
                weight[r.group] = weight.get(r.group, 0) + 1
    return balance_by_swaps(engine_of, weight, n)
