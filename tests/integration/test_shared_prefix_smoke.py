"""The shared-prefix benchmark runner at a tiny size (seconds), and the CI comparison.

No wall-clock thresholds: the smoke run disables the lag rejection (--max-lag huge) and
checks completeness and consistency, plus what the physics implies within one run: the
greedy reference (which knows where each prefix is cached) hits the cache more than
round-robin.
The CI comparison (issue 4) keeps the lag rejection on and fails, saying why, when the
machine could not keep the simulated schedule.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.shared_prefix import policies, report

ROOT = Path(__file__).resolve().parents[2]
HIT_MARGIN = 0.05  # greedy reference over round-robin, absolute (observed: ~20-35 points)
GREEDY = policies.GREEDY


def run_runner(out: Path, *args: str, timeout_s: float = 1200.0) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "loadtest.shared_prefix.runner", "--out", str(out),
           "--quiet", *args]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert p.returncode == 0, f"runner exited {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads((out / "results.json").read_text())


def row(summary: dict[str, Any], policy: str, table: int = 0) -> dict[str, Any]:
    r = summary["tables"][table]["rows"][policy]
    assert not r.get("skipped"), f"{policy} skipped: {r.get('skipped')}"
    return r


def check_consistent(summary: dict[str, Any], policy: str) -> None:
    r = row(summary, policy)
    wl = summary["workload"]
    n = wl["num_groups"] * wl["prompts_per_group"]
    assert r["seeds_run"] == len(summary["seeds"]) and r["seeds_ok"] == r["seeds_run"]
    for c in r["cells"]:
        assert c["requests"] == n and c["completed"] == n and c["ok"] == n, c["errors"]
        assert 0 < c["prefix_hits"] <= c["prefix_queries"]
        m = c["metrics"]
        assert set(report.METRICS) <= set(m)
        assert 0.0 <= m["hit_rate"] <= 1.0
        assert m["req_s"] > 0
        assert 0 < m["ttft_p50_s"] <= m["ttft_p90_s"] <= m["ttft_p99_s"]
        assert m["ttft_mean_s"] < m["e2e_mean_s"]
        # the engines' TTFT is part of the client's: the router and client add the rest
        assert 0 < c["engine_ttft_mean_s"] < m["ttft_mean_s"]
        assert c["added_ttft_mean_ms"] == pytest.approx(
            1000 * (m["ttft_mean_s"] - c["engine_ttft_mean_s"]))
        if "per_engine_requests" in c:
            assert sum(c["per_engine_requests"]) == n
    for metric, agg in r["aggregate"].items():
        assert agg["min"] <= agg["mean"] <= agg["max"], metric


def mean(summary: dict[str, Any], policy: str, metric: str, table: int = 0) -> float:
    v = row(summary, policy, table)["aggregate"][metric]["mean"]
    assert v is not None, f"{policy}: no {metric}"
    return float(v)


def assert_prefix_aware_wins(summary: dict[str, Any], aware: str, baseline: str) -> None:
    """The CI comparison (issue 4): `aware` vs `baseline` (random) in the same run."""
    hit_a, hit_b = mean(summary, aware, "hit_rate"), mean(summary, baseline, "hit_rate")
    rps_a, rps_b = mean(summary, aware, "req_s"), mean(summary, baseline, "req_s")
    ttft_a, ttft_b = mean(summary, aware, "ttft_mean_s"), mean(summary, baseline, "ttft_mean_s")
    assert hit_a >= hit_b + 0.20, f"hit rate {aware} {hit_a:.3f} vs {baseline} {hit_b:.3f}"
    assert rps_a >= 1.5 * rps_b, f"req/s {aware} {rps_a:.2f} vs {baseline} {rps_b:.2f}"
    assert ttft_a < ttft_b, f"mean TTFT {aware} {ttft_a:.3f}s vs {baseline} {ttft_b:.3f}s"


def test_runner_smoke_round_robin_and_greedy_reference(tmp_path: Path) -> None:
    # `cand`: a candidate routerConfiguration named on the command line (not in the table).
    # The hot-spot guard is set to fire on any load gap (0 requests, 1x), so that the
    # runner's count of its decisions must be positive; 8 groups over 3 engines with
    # prefix affinity always leave one engine busier than another.
    cand = ROOT / "configs" / "scheduling" / "prefix-cache.yaml"
    s = run_runner(tmp_path, "--profile", "tiny", "--policies", f"round-robin,{GREEDY},cand",
                   "--policy-config", f"cand={cand}", "--seeds", "1", "--max-lag", "1e9",
                   "--router-arg=--hot-spot-abs=0", "--router-arg=--hot-spot-rel=1",
                   timeout_s=300)
    for p in ("round-robin", GREEDY, "cand"):
        check_consistent(s, p)
    assert row(s, "cand")["cells"][0]["hot_spot_reorders"] > 0
    assert "hot_spot_reorders" not in row(s, "round-robin")["cells"][0]
    greedy_cell = row(s, GREEDY)["cells"][0]
    # engines without KV events do not publish their cache content: the greedy reference
    # works from its own model of it
    assert greedy_cell["greedy_cache_source"] == "model"
    assert mean(s, GREEDY, "hit_rate") >= mean(s, "round-robin", "hit_rate") + HIT_MARGIN
    md = (tmp_path / "results.md").read_text()
    assert "| round-robin | 1/1 |" in md and f"| {GREEDY} | 1/1 |" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "ttft_kv0.5.png").stat().st_size > 0


def test_hard_profile_cell_counts_the_guard(tmp_path: Path) -> None:
    # The hard workloads' runner records the guard's decisions too (same 0 / 1x setting:
    # Zipf groups leave one engine busier than the others).
    s = run_runner(tmp_path, "--profile", "zipf", "--set", "num_requests=40", "--time-scale", "12",
                   "--policies", "best", "--seeds", "1", "--max-lag", "1e9",
                   "--router-arg=--hot-spot-abs=0", "--router-arg=--hot-spot-rel=1",
                   timeout_s=300)
    cell = row(s, "best")["cells"][0]
    assert cell["ok"] == cell["requests"] == 40
    assert 0 < cell["hot_spot_reorders"] <= 40


def test_runner_policy_aliases_and_seed_sets() -> None:
    from loadtest.shared_prefix import runner

    a = runner.parse_args(["--out", "unused", "--policies", "oracle"])
    assert [p.name for p in a.policy_list] == [GREEDY]  # the earlier name still works
    assert a.seed_list == [4, 5, 6]  # reported on seeds that configurations were not picked on
    assert runner.parse_args(["--out", "unused", "--seeds", "tuning"]).seed_list == [1, 2, 3]


def test_runner_refuses_a_candidate_without_a_file(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "loadtest.shared_prefix.runner", "--out", str(tmp_path),
           "--policies", "cand", "--policy-config", f"cand={tmp_path / 'missing.yaml'}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--policy-config wants NAME=PATH with an existing file" in p.stderr


# The CI comparison: the `ci` profile (64 groups x 8 requests, published prompt shape and
# per-group load, KV x0.5 = the published regime) at its time scale 6, seed 4: ~35
# simulated s -> ~4 wall minutes for both policies. Smaller runs shrink the batch per
# engine, so decode takes a larger share of engine time and the physics' throughput gain
# approaches 1.5x (docs/benchmarks.md): the margins would be noise.
CI_ARGS = ("--profile", "ci", "--seeds", "4")  # a report seed (docs/benchmarks.md)
AWARE = "best"  # our shipped configuration (configs/scheduling/best.yaml)


def rejected_cells(summary: dict[str, Any], policies_: tuple[str, ...]) -> list[str]:
    return [f"{p} seed {c['seed']}: {c['reject_reason']}" for p in policies_
            for c in row(summary, p)["cells"] if not c["accepted"]]


@pytest.mark.timeout(900)
def test_prefix_aware_beats_random_ci(tmp_path: Path) -> None:
    """Issue 4's physics check, within one run: prefix-aware routing vs random."""
    pair = ("random", AWARE)
    s = run_runner(tmp_path, *CI_ARGS, "--policies", ",".join(pair), timeout_s=840)
    # A CPU-starved run measures the machine, not the policy: say so instead of passing
    # or failing on noise.
    bad = rejected_cells(s, pair)
    if bad:
        pytest.fail("run rejected, the machine was too busy to keep the simulated schedule "
                    f"(rerun on a quieter machine or raise --time-scale): {bad}")
    for p in pair:
        check_consistent(s, p)
    assert_prefix_aware_wins(s, AWARE, "random")


def test_partition_references_pin_each_group_to_its_engine(tmp_path: Path) -> None:
    # The static partitions send straight to the engines: each engine serves exactly the
    # requests of the groups its map gives it (read back from the simulator's counters).
    from dataclasses import replace

    from loadtest.shared_prefix import partition, runner

    args = ("--profile", "bursts", "--set", "capacity=16", "--set", "num_groups=6",
            "--time-scale", "2", "--seeds", "1", "--max-lag", "1e9")
    s = run_runner(tmp_path, *args, "--policies",
                   "partition-first-seen,partition-hindsight,direct,best", timeout_s=300)
    assert "hard workloads only" not in json.dumps(s)  # run, not skipped
    assert s["tables"][0]["rows"]["direct"]["skipped"] == "not defined for the hard workloads"
    spec = replace(runner.parse_args(["--out", "unused", *args]).hard_spec, seed=1)
    plan = spec.plan()
    for name, kind in (("partition-first-seen", partition.FIRST_SEEN),
                       ("partition-hindsight", partition.HINDSIGHT)):
        cell = row(s, name)["cells"][0]
        assert cell["ok"] == cell["requests"] == len(plan.requests)
        m = partition.partition(kind, spec, plan, 3)
        want = [sum(1 for r in plan.requests if m[r.group] == e) for e in range(3)]
        assert cell["per_engine"]["requests_finished_total"] == want, name
        homed = [sum(1 for g in m.values() if g == e) for e in range(3)]
        g = cell["group_placement"]
        assert (g["requests_seen"], g["groups_served"], g["groups_homed"], g["groups_split"]) == (
            len(plan.requests), homed, homed, 0), name
        assert {int(k): v.index(max(v)) for k, v in g["per_group"].items()} == m, name
    # through our router the request ids reach the engines too: every request is traced
    g = row(s, "best")["cells"][0]["group_placement"]
    assert g["requests_seen"] == len(plan.requests) and sum(g["groups_homed"]) == 6


def test_partitions_are_refused_on_the_shared_prefix_profiles(tmp_path: Path) -> None:
    s = run_runner(tmp_path, "--profile", "tiny", "--policies", "partition-first-seen,round-robin",
                   "--seeds", "1", "--max-lag", "1e9", timeout_s=300)
    assert s["tables"][0]["rows"]["partition-first-seen"]["skipped"] == "defined for the hard workloads only"
    assert row(s, "round-robin")["seeds_ok"] == 1
