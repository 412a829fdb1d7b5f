"""Which engine served which group, from the engines' request logs (placement.py)."""

from __future__ import annotations

from loadtest.shared_prefix import placement


def _log(*ids: str | None) -> dict:  # type: ignore[type-arg]
    return {"received": len(ids), "log": [{"request_id": i} for i in ids]}


def test_served_by_reads_the_bench_ids_and_skips_the_rest() -> None:
    logs = [_log("bench-0", "bench-3", None), _log("bench-1", "other-2", "bench-x"), _log("bench-2")]
    assert placement.served_by(logs) == {0: 0, 3: 0, 1: 1, 2: 2}
    assert placement.request_id(17) == "bench-17"


def test_group_figures_count_served_homed_and_split_groups() -> None:
    group_of = {0: 5, 1: 5, 2: 5, 3: 6, 4: 7, 5: 7}
    served = {2: 1, 0: 0, 1: 0, 3: 1, 4: 2, 5: 2}  # group 5 mostly on 0, then once on 1
    g = placement.group_figures(served, group_of, 3)
    assert g == {"requests_seen": 6, "groups_served": [1, 2, 1], "groups_homed": [1, 1, 1],
                 "groups_split": 1, "per_group": {"5": [2, 1, 0], "6": [0, 1, 0], "7": [0, 0, 2]},
                 "order": {"5": [0, 0, 1], "6": [1], "7": [2, 2]}}


def test_no_traced_request_gives_empty_figures() -> None:
    g = placement.group_figures({}, {0: 1}, 2)
    assert g == {"requests_seen": 0, "groups_served": [0, 0], "groups_homed": [0, 0],
                 "groups_split": 0, "per_group": {}, "order": {}}
