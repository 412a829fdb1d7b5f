"""Runner bookkeeping without processes: merging runs cell by cell, kv-events detection."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.shared_prefix import merge, policies


def _cell(policy: str, seed: int, req_s: float, accepted: bool = True) -> dict[str, Any]:
    m = {"req_s": req_s, "ttft_mean_s": 1.0, "ttft_p50_s": 1.0, "ttft_p90_s": 1.0,
         "ttft_p99_s": 1.0, "e2e_mean_s": 2.0, "hit_rate": 0.5}
    return {"policy": policy, "seed": seed, "accepted": accepted, "metrics": m}


def _summary(rows: dict[str, list[dict[str, Any]]], kv: float = 0.5,
             time_scale: float = 6.0) -> dict[str, Any]:
    return {"profile": "ci", "workload": {"num_groups": 64}, "time_scale": time_scale,
            "engines": 3, "block_size": 16, "model": "m", "seeds": sorted(
                {c["seed"] for cs in rows.values() for c in cs}),
            "tables": [{"kv_factor": kv, "kv_blocks": 10, "rows": {
                n: {"seeds_run": len(cs), "seeds_ok": len(cs), "aggregate": {}, "cells": cs}
                for n, cs in rows.items()}}]}


def test_merge_pools_seeds_and_recomputes_the_aggregate() -> None:
    a = _summary({"best": [_cell("best", 1, 10.0)], "random": [_cell("random", 1, 5.0)]})
    b = _summary({"best": [_cell("best", 2, 20.0), _cell("best", 3, 0.0, accepted=False)]})
    out = merge.merge([a, b])
    rows = out["tables"][0]["rows"]
    assert list(rows) == ["random", "best"]  # the table order
    best = rows["best"]
    assert (best["seeds_run"], best["seeds_ok"]) == (3, 2)
    assert best["aggregate"]["req_s"] == {"mean": 15.0, "min": 10.0, "max": 20.0}
    assert out["seeds"] == [1, 2, 3]


def test_merge_later_seed_replaces_and_factors_stay_apart() -> None:
    a = _summary({"best": [_cell("best", 1, 10.0)]})
    b = _summary({"best": [_cell("best", 1, 12.0)]})
    c = _summary({"best": [_cell("best", 1, 30.0)]}, kv=2.0)
    out = merge.merge([a, b, c])
    assert [t["kv_factor"] for t in out["tables"]] == [0.5, 2.0]
    assert out["tables"][0]["rows"]["best"]["aggregate"]["req_s"]["mean"] == 12.0


def test_merge_refuses_incomparable_runs() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        merge.merge([_summary({}), _summary({}, time_scale=3.0)])


def test_kv_events_follow_the_enabled_plugins_not_the_comments() -> None:
    assert policies.POLICIES["kvcache-aware+least-request"].needs_kv_events
    assert not policies.POLICIES["prefix-cache+least-request"].needs_kv_events
    # a configuration that names kvcache-aware in its comments only
    assert not policies.uses_kv_events("# kvcache-aware\nscheduler: {plugins: {Score: "
                                       "{enabled: [{name: prefix-cache, weight: 1}]}}}")
    assert policies.uses_kv_events("scheduler: {plugins: {Score: {enabled: "
                                   "[{name: kvcache-aware, weight: 1}]}}}")
