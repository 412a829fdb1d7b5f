"""Cells of the hard workloads (issue 15): `runner.py --profile zipf|multiturn|mixed|bursts|lora`.

The cell loop and its discipline are runner.py's (cells.py: fresh engines per cell,
seed-major order, lag and error rejection, simulated-time figures); a hard cell adds what
these workloads need: the closed-loop session driver, per-profile engine arguments (LoRA
slots) and KV size, the ModelRoute's loraAdapters, and per-engine figures for every policy
(requests finished, prefix hits / queries, LoRA loads, and queue length over time), read
from the simulator, so that a cell routed by a peer can be explained as well as one
routed by us.
The greedy reference and `direct` are not defined for these workloads; the static group
partitions (partition.py) are, and only here.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.ports import free_port_block
from loadtest.procs import Proc
from . import cells, cluster, partition, placement, policies, report
from .hard_plots import plot_load
from .client import Chooser, Result, RunStats, drive_sessions
from .hard_workloads import HardSpec, HardRequest

PER_ENGINE = ("requests_finished_total", "prefix_hits_total", "prefix_queries_total",
              "lora_loads_total", "preemptions_total")


def _per_engine(states: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {k: [sum(r.get(k, 0) for r in s["ranks"]) for s in states] for k in PER_ENGINE}


def _percentile(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    v = sorted(vals)
    return v[min(len(v) - 1, int(q * len(v)))]


async def run_hard_cell(a: argparse.Namespace, spec: HardSpec, pol: policies.Policy,
                        sched_yaml: str | None, seed: int,
                        logdir: Path) -> tuple[dict[str, Any], list[float]]:
    spec = replace(spec, seed=seed)
    k = a.time_scale
    plan = spec.plan()
    reqs = plan.requests
    by_index: dict[int, HardRequest] = {r.index: r for r in reqs}
    procs: list[Proc] = []
    timeline: list[tuple[float, list[int]]] = []  # (sim s, running + waiting per engine)
    needs_events = pol.kv_events or policies.uses_kv_events(sched_yaml)
    kv_fallbacks: float | None = None
    hot_spot: float | None = None
    try:
        ev_base = free_port_block(2 * cluster.N_ENGINES) if needs_events else None
        ports, admin = cluster.start_engines(logdir, procs, spec.kv_blocks, k, seed,
                                             kv_events_base=ev_base,
                                             extra_args=spec.engine_args)
        admin_url = f"http://127.0.0.1:{admin}"
        engine_urls = [f"http://127.0.0.1:{p}" for p in ports]
        router_admin: str | None = None
        urls: list[str]
        chooser = Chooser()
        if pol.kind == "router":
            if sched_yaml is not None:  # the router's deadlines in simulated time
                sched_yaml = cluster.with_sim_time_traffic(sched_yaml, k)
            url, router_admin = cluster.start_router(
                logdir, procs, ports, pol, sched_yaml, kv_events_base=ev_base,
                extra_args=tuple(a.router_arg), lora_adapters=spec.lora_adapters)
            urls = [url]
        elif pol.kind == "partition":
            urls = engine_urls
            chooser = partition.GroupMap(partition.partition(pol.partition, spec, plan,
                                                             len(engine_urls)))
        else:
            urls = [cluster.start_peer(logdir, procs, ports, pol.peer or "",
                                       policy=pol.peer_policy)]
        states0 = await asyncio.to_thread(cluster.engine_states, admin_url)
        ttft0 = await asyncio.to_thread(cluster.engine_ttft_totals, engine_urls)
        live = RunStats()
        done = [0, 0]

        def on_result(r: Result) -> None:
            done[0] += 1
            done[1] += not r.ok

        t0 = time.perf_counter()
        run = asyncio.create_task(drive_sessions(
            plan.sessions, [s * k for s in plan.starts],
            [[t * k for t in th] for th in plan.thinks], urls, chooser, cluster.MODEL,
            spec.max_concurrency, a.request_timeout, on_result, live))
        while not run.done():
            await asyncio.wait({run}, timeout=1.0)
            st = await asyncio.to_thread(cluster.engine_states, admin_url)
            t_sim = (time.perf_counter() - t0) / k
            timeline.append((round(t_sim, 3), [int(s["running"] + s["waiting"]) for s in st]))
            if not a.quiet and len(timeline) % 5 == 0:
                print(f"  [{spec.name} {pol.name} s{seed}] {done[0]}/{len(reqs)} done "
                      f"({done[1]} failed), {live.in_flight} in flight, queues "
                      f"{timeline[-1][1]}, lag max "
                      f"{max(s['lag_max_seconds'] for s in st):.3f}s", file=sys.stderr,
                      flush=True)
        stats = run.result()
        states1 = await asyncio.to_thread(cluster.engine_states, admin_url)
        groups = await asyncio.to_thread(placement.read, admin_url,
                                         {r.index: r.group for r in reqs}, len(engine_urls))
        ttft1 = await asyncio.to_thread(cluster.engine_ttft_totals, engine_urls)
        if router_admin is not None and needs_events:
            kv_fallbacks = await asyncio.to_thread(
                cluster.router_counter, router_admin, "kthena_router_kvcache_aware_fallback_total")
        if router_admin is not None and sched_yaml is not None:
            hot_spot = await asyncio.to_thread(
                cluster.router_counter, router_admin, "kthena_router_hot_spot_reorders_total")
    finally:
        for p in reversed(procs):
            p.stop()

    pe0, pe1 = _per_engine(states0), _per_engine(states1)
    per_engine = {key: [b - a_ for a_, b in zip(pe0[key], pe1[key])] for key in PER_ENGINE}
    hits, queries = sum(per_engine["prefix_hits_total"]), sum(per_engine["prefix_queries_total"])
    ok = [r for r in stats.results if r.ok]
    verdict = cells.judge(stats, states1, k, a.max_lag)
    ttfts = [r.ttft_s / k for r in ok]
    metrics = report.cell_metrics(ttfts, [r.e2e_s / k for r in ok], verdict.sim_s, hits, queries)
    # output tokens per simulated second: the throughput figure when request sizes differ
    metrics["output_tok_s"] = sum(by_index[r.index].max_tokens for r in ok) / verdict.sim_s
    kinds: dict[str, list[float]] = {}
    for r in ok:
        kinds.setdefault(by_index[r.index].kind, []).append(r.ttft_s / k)
    cell: dict[str, Any] = {
        "policy": pol.name, "seed": seed, "kv_factor": 1.0, "kv_blocks": spec.kv_blocks,
        "accepted": verdict.reason is None, "reject_reason": verdict.reason,
        "requests": len(reqs), "completed": len(stats.results), "ok": len(ok),
        "errors": verdict.errors, "wall_s": stats.wall_s, "sim_duration_s": verdict.sim_s,
        "engine_lag_max_s": verdict.lag_max, "send_late_max_s": verdict.send_late,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "prefix_hits": hits, "prefix_queries": queries, "metrics": metrics,
        "per_engine": per_engine,
        "group_placement": groups,
        "per_engine_hit_rate": [h / q if q else None for h, q in
                                zip(per_engine["prefix_hits_total"],
                                    per_engine["prefix_queries_total"])],
        "ttft_p90_by_kind_s": {kd: _percentile(v, 0.9) for kd, v in sorted(kinds.items())},
        "queue_timeline": timeline,
        "ttft_samples_s": [round(x, 5) for x in ttfts],
    }
    cells.add_engine_ttft(cell, ttfts, ttft0, ttft1)
    if needs_events:
        cell["kvcache_aware_fallbacks"] = kv_fallbacks
    if hot_spot is not None:  # decisions where the router's hot-spot guard overrode the scores
        cell["hot_spot_reorders"] = hot_spot
    return cell, ttfts


def _cell_line(spec: HardSpec, cell: dict[str, Any]) -> str:
    m = cell["metrics"]
    verdict = "ok" if cell["accepted"] else f"REJECTED ({cell['reject_reason']})"
    pe = cell["per_engine"]
    hr = " ".join("-" if h is None else f"{100 * h:.0f}%" for h in cell["per_engine_hit_rate"])
    return (f"{spec.name} {cell['policy']} seed={cell['seed']}: {cell['ok']}/{cell['requests']} ok, "
            f"{m['req_s']:.2f} req/s, {m['output_tok_s']:.0f} out tok/s, TTFT mean "
            f"{m['ttft_mean_s'] or math.nan:.3f}s p90 {m['ttft_p90_s'] or math.nan:.3f}s, hit "
            f"{100 * (m['hit_rate'] or 0):.1f}%, per engine reqs "
            f"{[int(x) for x in pe['requests_finished_total']]} hit {hr}, lag "
            f"{cell['engine_lag_max_s']:.3f}s, load {cell['load_avg_1m']:.1f}"
            + (f", guard {cell['hot_spot_reorders']:.0f}" if "hot_spot_reorders" in cell else "")
            + _groups_text(cell["group_placement"])
            + f" -> {verdict}")


def _groups_text(g: dict[str, Any]) -> str:
    if not g.get("requests_seen"):
        return ", groups not traced"
    return (f", groups served {g['groups_served']} homed {g['groups_homed']} "
            f"split {g['groups_split']}")


def _refuse(pol: policies.Policy) -> str | None:
    return None if pol.kind in ("router", "peer", "partition") else "not defined for the hard workloads"


async def bench(a: argparse.Namespace, spec: HardSpec, logdir: Path) -> dict[str, Any]:
    summary = cells.summary(a, spec.name, spec.to_json())
    a.out.mkdir(parents=True, exist_ok=True)
    block: dict[str, Any] = {"kv_factor": 1.0, "kv_blocks": spec.kv_blocks, "rows": {}}
    summary["tables"].append(block)

    def run(pol: policies.Policy, sched: str | None, seed: int,
            cell_dir: Path) -> Awaitable[tuple[dict[str, Any], list[float]]]:
        return run_hard_cell(a, spec, pol, sched, seed, cell_dir)

    table, ttfts = await cells.run_table(a, block, logdir, run, lambda c: _cell_line(spec, c), refuse=_refuse)
    for name, row_cells in table.items():
        vals = [c["metrics"]["output_tok_s"] for c in row_cells if c["accepted"]]
        block["rows"][name]["aggregate"]["output_tok_s"] = (
            {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)} if vals
            else {"mean": None, "min": None, "max": None})
    if ttfts:
        report.plot_ttft(a.out / f"ttft_{spec.name}.png", ttfts,
                         f"TTFT, workload {spec.name}, time scale {a.time_scale:g}")
    plot_load(a.out / f"load_{spec.name}.png", table,
              f"Per-engine queue over time, workload {spec.name} (seed {a.seed_list[0]})")
    report.write_json(a.out / "results.json", summary)
    (a.out / "results.md").write_text(report.markdown(summary) + "\n" + per_engine_md(summary))
    return summary


def per_engine_md(summary: dict[str, Any]) -> str:
    """Per-engine requests / hit rate / LoRA loads per cell (what explains a cell)."""
    lines = ["| policy | seed | out tok/s | requests per engine | hit rate per engine | "
             "LoRA loads per engine | TTFT p90 by kind (s) | added TTFT (ms) | lag (s) | "
             "load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for block in summary["tables"]:
        for name, row in block["rows"].items():
            for c in row.get("cells", []):
                pe = c["per_engine"]
                hr = " / ".join("-" if h is None else f"{100 * h:.0f}%"
                                for h in c["per_engine_hit_rate"])
                kinds = ", ".join(f"{kd} {v:.3g}" for kd, v in c["ttft_p90_by_kind_s"].items()
                                  if v is not None)
                lines.append(f"| {name} | {c['seed']}{'' if c['accepted'] else ' (rejected)'} | "
                             f"{c['metrics']['output_tok_s']:.0f} | "
                             f"{' / '.join(str(int(x)) for x in pe['requests_finished_total'])} | "
                             f"{hr} | {' / '.join(str(int(x)) for x in pe['lora_loads_total'])} | "
                             f"{kinds} | {c.get('added_ttft_mean_ms', math.nan):.0f} | "
                             f"{c['engine_lag_max_s']:.2f} | {c['load_avg_1m']:.1f} |")
    return "\n".join(lines) + "\n"
