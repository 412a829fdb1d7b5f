"""PD benchmark (issue 10): 2 aggregated engines vs 1 prefill + 1 decode (NIXL) vs the
same with conditional disaggregation, on the simulator, at a rising request rate.

    python -m loadtest.bench_pd --out results/pd.json                        # report seeds
    python -m loadtest.bench_pd --cells pd-cond --min-uncached 256,512,1024,2048 \\
        --seeds tuning --out results/pd-tuning.json                        # choose N

Per cell and seed: a fresh simulator (2 engines, the calibrated H200 cost model, not
--fast) and a fresh router; then one phase per rate (lowest first) of open-loop Poisson
arrivals, streamed, each phase drained before the next. The client measures TTFT and
every inter-token gap (ITL). Reported per rate: p50/p90/p99 of TTFT and ITL (pooled over
seeds), and per cell the highest rate whose p99 ITL stays <= --itl-slo-ms (also with
p99 TTFT <= --ttft-slo-ms). Workload: loadtest/pd_bench/workload.py; cells:
loadtest/pd_bench/cluster.py; analysis: docs/pd-benchmark.md.

Seeds: --min-uncached is chosen on the tuning seeds (1,2,3, `--seeds tuning`) and
reported on others (4,5,6, `--seeds report`, the default).

Time scale: the engines run --time-scale times slower than wall time so that a small
machine keeps the simulated schedule; every reported time and rate is simulated (wall /
time scale). A phase is marked invalid when an engine's step loop or the sender fell
behind by more than --max-lag of the phase (the figures would be the machine's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtest.loadgen import install_uvloop
from loadtest.procs import Proc, StartError
from loadtest.pd_bench import cluster, report
from loadtest.pd_bench.client import PhaseRun, drive
from loadtest.pd_bench.workload import DEFAULT_RATES, WorkloadSpec, generate_phase

SEED_SETS = {"tuning": (1, 2, 3), "report": (4, 5, 6)}
DEFAULT_TIME_SCALE = 8.0


def _floats(p: argparse.ArgumentParser, flag: str, raw: str) -> list[float]:
    try:
        vals = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag} wants comma-separated numbers, got {raw!r}")
    if not vals or any(v <= 0 for v in vals):
        p.error(f"{flag} wants positive numbers, got {raw!r}")
    return vals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default="agg,pd,pd-cond",
                   help="comma-separated: agg, agg-cN (max-num-batched-tokens N), pd, pd-cond (one "
                        "cell per --min-uncached), pd-cond-N")
    p.add_argument("--min-uncached", default="512",
                   help="pd.minUncachedTokens of the pd-cond cells, comma-separated (> 0)")
    p.add_argument("--seeds", default="report",
                   help="'tuning' (1,2,3), 'report' (4,5,6; default) or comma-separated integers")
    w = p.add_argument_group("workload (loadtest/pd_bench/workload.py)")
    w.add_argument("--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES),
                   help="req/s (simulated), rising; one phase each")
    w.add_argument("--requests-per-rate", type=int, default=WorkloadSpec.requests_per_rate)
    w.add_argument("--duration-per-rate", type=float, default=None,
                   help="simulated s of arrivals per phase (instead of --requests-per-rate)")
    w.add_argument("--prompt-len", type=int, default=WorkloadSpec.prompt_len)
    w.add_argument("--output-len", type=int, default=WorkloadSpec.output_len)
    w.add_argument("--followup-share", type=float, default=WorkloadSpec.followup_share)
    w.add_argument("--followup-new-min", type=int, default=WorkloadSpec.followup_new_min)
    w.add_argument("--followup-new-max", type=int, default=WorkloadSpec.followup_new_max)
    w.add_argument("--followup-min-gap-s", type=float, default=WorkloadSpec.followup_min_gap_s)
    e = p.add_argument_group("engines and router")
    e.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                   help="wall seconds per simulated second")
    e.add_argument("--kv-bandwidth-gbps", type=float, default=400.0)
    e.add_argument("--max-num-batched-tokens", type=int, default=cluster.MAX_NUM_BATCHED_TOKENS)
    e.add_argument("--prefill-timeout", default="60s", help="pd.prefillTimeout")
    e.add_argument("--sim-arg", default="", help="extra simulator arguments (one shell string)")
    e.add_argument("--router-arg", default="", help="extra router arguments (one shell string)")
    r = p.add_argument_group("objectives and validity")
    r.add_argument("--itl-slo-ms", type=float, default=50.0)
    r.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    r.add_argument("--stop-ttft-p50-s", type=float, default=10.0,
                   help="skip a cell's higher rates once a phase's p50 TTFT exceeds this (simulated s)")
    r.add_argument("--max-lag", type=float, default=0.03,
                   help="a phase is invalid when engines or sender lag more than this fraction of it")
    r.add_argument("--max-concurrency", type=int, default=1024, help="safety cap on requests in flight")
    r.add_argument("--request-timeout", type=float, default=900.0, help="wall seconds")
    p.add_argument("--out", type=Path, required=True, help="JSON file (the Markdown goes next to it, .md)")
    p.add_argument("--dry-run", action="store_true",
                   help="write each cell's configuration files and print its commands; start nothing")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    a.rate_list = sorted(_floats(p, "--rates", a.rates))
    mu = _floats(p, "--min-uncached", a.min_uncached)
    if any(v != int(v) for v in mu):
        p.error("--min-uncached wants integers")
    try:
        a.cell_list = cluster.parse_cells(a.cells, [int(v) for v in mu])
    except ValueError as ex:
        p.error(str(ex))
    try:
        a.seed_list = list(SEED_SETS.get(a.seeds) or (int(s) for s in a.seeds.split(",") if s.strip()))
    except ValueError:
        p.error(f"--seeds wants 'tuning', 'report' or integers, got {a.seeds!r}")
    if not a.seed_list:
        p.error("--seeds lists no seed")
    if a.time_scale <= 0 or a.requests_per_rate < 1 or a.prompt_len < 16 or a.output_len < 2:
        p.error("--time-scale > 0, --requests-per-rate >= 1, --prompt-len >= 16, --output-len >= 2")
    if not 0.0 <= a.followup_share <= 1.0:
        p.error("--followup-share must be in [0, 1]")
    if not 1 <= a.followup_new_min <= a.followup_new_max:
        p.error("--followup-new-min must be >= 1 and <= --followup-new-max")
    a.spec = WorkloadSpec(prompt_len=a.prompt_len, output_len=a.output_len,
                          rates=tuple(a.rate_list), requests_per_rate=a.requests_per_rate,
                          duration_per_rate=a.duration_per_rate, followup_share=a.followup_share,
                          followup_new_min=a.followup_new_min, followup_new_max=a.followup_new_max,
                          followup_min_gap_s=a.followup_min_gap_s)
    return a


# ------------------------------------------------------------------------------ one phase


def _pd_counter(states: list[dict[str, Any]], name: str) -> float:
    return sum((s.get("pd") or {}).get(name, 0) for s in states)


def _rank_counter(states: list[dict[str, Any]], name: str) -> float:
    return sum(r.get(name, 0) for s in states for r in s["ranks"])


def phase_record(a: argparse.Namespace, cell: cluster.Cell, rate: float, run: PhaseRun,
                 s0: list[dict[str, Any]], s1: list[dict[str, Any]]) -> dict[str, Any]:
    k = a.time_scale
    ok = [r for r in run.results if r.ok]
    errors: dict[str, int] = {}
    for r in run.results:
        if not r.ok:
            key = (r.error or "?")[:120]
            errors[key] = errors.get(key, 0) + 1
    sim_s = run.wall_s / k
    lag0 = max(s["lag_max_seconds"] for s in s0)
    lag1 = max(s["lag_max_seconds"] for s in s1)
    send_late = run.max_send_late_s / k
    reason = None
    if lag1 > lag0 and lag1 > a.max_lag * sim_s:
        reason = f"engine lag {lag1:.3f}s > {a.max_lag:.0%} of the {sim_s:.1f}s phase"
    elif send_late > a.max_lag * sim_s:
        reason = f"sender {send_late:.3f}s behind schedule > {a.max_lag:.0%} of the phase"
    rec: dict[str, Any] = {
        "rate": rate, "sent": len(run.results), "ok": len(ok), "failed": len(run.results) - len(ok),
        "errors": errors, "sim_duration_s": sim_s,
        "achieved_req_s": len(ok) / sim_s if sim_s > 0 else 0.0,
        "ttft_ms": report.dist_ms([r.ttft_s / k for r in ok]),
        "itl_ms": report.dist_ms([g / k for r in ok for g in r.itl_s]),
        "e2e_ms": report.dist_ms([r.e2e_s / k for r in ok]),
        "tokens_per_reply": sorted({r.tokens for r in ok}),
        "send_late_max_s": send_late, "capped_sends": run.capped_sends,
        "engine_lag_max_s": lag1, "valid": reason is None, "invalid_reason": reason,
        "preemptions": _rank_counter(s1, "preemptions_total") - _rank_counter(s0, "preemptions_total"),
        "prefix_hits": _rank_counter(s1, "prefix_hits_total") - _rank_counter(s0, "prefix_hits_total"),
        "prefix_queries": _rank_counter(s1, "prefix_queries_total") - _rank_counter(s0, "prefix_queries_total"),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if cell.is_pd:
        d = {n: _pd_counter(s1, n) - _pd_counter(s0, n)
             for n in ("prefill_requests", "remote_prefill_decodes", "kv_sent_bytes",
                       "kv_transfer_seconds", "kv_wait_seconds", "kv_load_failures")}
        rec["pd"] = d
        rec["decode_alone"] = max(0, len(ok) - int(d["remote_prefill_decodes"]))
        if d["remote_prefill_decodes"]:
            rec["kv_wait_mean_ms"] = 1000 * d["kv_wait_seconds"] / d["remote_prefill_decodes"]
    return rec


async def run_cell(a: argparse.Namespace, cell: cluster.Cell, seed: int, logdir: Path,
                   pooled: dict[float, dict[str, Any]]) -> dict[str, Any]:
    """One (cell, seed): start, one phase per rate, stop. Adds samples to `pooled`."""
    procs: list[Proc] = []
    phases: list[dict[str, Any]] = []
    spec = WorkloadSpec(**{**a.spec.to_json(), "seed": seed})
    try:
        st = await asyncio.to_thread(
            cluster.start, cell, logdir, procs, time_scale=a.time_scale, seed=seed,
            kv_bandwidth_gbps=a.kv_bandwidth_gbps, max_num_batched_tokens=a.max_num_batched_tokens,
            prefill_timeout=a.prefill_timeout, sim_args=a.sim_arg, router_args=a.router_arg)
        stop_reason = None
        for i, rate in enumerate(a.rate_list):
            if stop_reason is not None:
                phases.append({"rate": rate, "skipped": stop_reason})
                pooled.setdefault(rate, {"skipped": []}).setdefault("skipped", []).append(stop_reason)
                continue
            reqs = generate_phase(spec, rate, i)
            s0 = await asyncio.to_thread(cluster.engine_states, st.admin_url)
            run = await drive(reqs, a.time_scale, st.url, cluster.MODEL, a.request_timeout,
                              a.max_concurrency)
            s1 = await asyncio.to_thread(cluster.engine_states, st.admin_url)
            ph = phase_record(a, cell, rate, run, s0, s1)
            ph["followups"] = sum(r.parent is not None for r in reqs)
            phases.append(ph)
            pool = pooled.setdefault(rate, {})
            k = a.time_scale
            okr = [r for r in run.results if r.ok]
            pool.setdefault("ttft", []).extend(r.ttft_s / k for r in okr)
            pool.setdefault("itl", []).extend(g / k for r in okr for g in r.itl_s)
            pool.setdefault("phases", []).append(ph)
            if not a.quiet:
                t, g = ph["ttft_ms"], ph["itl_ms"]
                print(f"  {cell.name} seed={seed} rate={rate:g}: {ph['ok']}/{ph['sent']} ok, "
                      f"{ph['achieved_req_s']:.2f} req/s, TTFT p50/p99 {t['p50'] or 0:.0f}/"
                      f"{t['p99'] or 0:.0f} ms, ITL p50/p99 {g['p50'] or 0:.1f}/{g['p99'] or 0:.1f} ms"
                      f"{'' if ph['valid'] else ' INVALID: ' + ph['invalid_reason']}",
                      file=sys.stderr, flush=True)
            if ph["failed"] * 2 > ph["sent"]:
                stop_reason = f"stopped: most requests failed at {rate:g} req/s"
            elif (ph["ttft_ms"]["p50"] or 0) > 1000 * a.stop_ttft_p50_s:
                stop_reason = f"stopped: p50 TTFT > {a.stop_ttft_p50_s:g}s at {rate:g} req/s"
    finally:
        for p in reversed(procs):
            p.stop()
    return {"seed": seed, "phases": phases,
            "max_rate_itl": report.max_rate(phases, a.itl_slo_ms),
            "max_rate_itl_ttft": report.max_rate(phases, a.itl_slo_ms, a.ttft_slo_ms)}


def pool_phases(rate: float, pool: dict[str, Any], n_seeds: int) -> dict[str, Any]:
    phases = pool.get("phases", [])
    skipped = pool.get("skipped", [])
    if not phases:
        return {"rate": rate, "skipped": skipped[0] if skipped else "not run"}
    rec: dict[str, Any] = {
        "rate": rate, "seeds": len(phases),
        "sent": sum(p["sent"] for p in phases), "ok": sum(p["ok"] for p in phases),
        "failed": sum(p["failed"] for p in phases),
        "achieved_req_s": sum(p["achieved_req_s"] for p in phases) / len(phases),
        "ttft_ms": report.dist_ms(pool["ttft"]), "itl_ms": report.dist_ms(pool["itl"]),
        "valid": all(p["valid"] for p in phases) and len(phases) == n_seeds, "notes": [],
    }
    if any("decode_alone" in p for p in phases):
        rec["decode_alone"] = sum(p.get("decode_alone", 0) for p in phases)
    if skipped:
        rec["notes"].append(f"{len(skipped)} seed(s) {skipped[0]}")
    bad = [p["invalid_reason"] for p in phases if not p["valid"]]
    if bad:
        rec["notes"].append(f"INVALID on {len(bad)} seed(s): {bad[0]}")
    return rec


def choose_min_uncached(cells: list[dict[str, Any]]) -> tuple[int | None, str]:
    rule = ("highest pooled rate meeting p99 ITL and p99 TTFT, then highest meeting p99 ITL, "
            "then lowest p99 TTFT at the first rate")
    cand = [c for c in cells if c.get("min_uncached_tokens") and not c.get("error")]
    if not cand:
        return None, rule

    def key(c: dict[str, Any]) -> tuple[float, float, float]:
        m = c["max_rate"]
        first = c["pooled"][0].get("ttft_ms", {}).get("p99") if c["pooled"] else None
        return (m["itl_ttft"] or -1.0, m["itl"] or -1.0, -(first or float("inf")))

    return max(cand, key=key)["min_uncached_tokens"], rule


async def bench(a: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "workload": a.spec.to_json(), "seeds": a.seed_list, "time_scale": a.time_scale,
        "kv_bandwidth_gbps": a.kv_bandwidth_gbps, "max_num_batched_tokens": a.max_num_batched_tokens,
        "itl_slo_ms": a.itl_slo_ms, "ttft_slo_ms": a.ttft_slo_ms, "max_lag_fraction": a.max_lag,
        "model": cluster.MODEL, "cells": [],
    }
    per_cell: dict[str, dict[str, Any]] = {}
    pooled: dict[str, dict[float, dict[str, Any]]] = {}
    for c in a.cell_list:
        rec = {"name": c.name, "roles": list(c.roles), "min_uncached_tokens": c.min_uncached_tokens,
               "max_num_batched_tokens": c.max_num_batched_tokens or a.max_num_batched_tokens,
               "per_seed": []}
        per_cell[c.name] = rec
        pooled[c.name] = {}
        summary["cells"].append(rec)
    # seed-major: the cells of one seed run back to back, so that a busy spell on a shared
    # machine hits every cell alike
    for seed in a.seed_list:
        for c in a.cell_list:
            rec = per_cell[c.name]
            if rec.get("error"):
                continue
            d = logdir / f"{c.name}-s{seed}"
            d.mkdir(parents=True, exist_ok=True)
            try:
                rec["per_seed"].append(await run_cell(a, c, seed, d, pooled[c.name]))
            except StartError as e:
                rec["error"] = str(e).splitlines()[0]
                print(f"{c.name} seed={seed}: cannot start: {e}", file=sys.stderr, flush=True)
    for c in a.cell_list:
        rec = per_cell[c.name]
        if rec.get("error"):
            continue
        rec["pooled"] = [pool_phases(r, pooled[c.name].get(r, {}), len(a.seed_list)) for r in a.rate_list]
        rec["max_rate"] = {
            "itl": report.max_rate(rec["pooled"], a.itl_slo_ms),
            "itl_ttft": report.max_rate(rec["pooled"], a.itl_slo_ms, a.ttft_slo_ms),
            "itl_per_seed": [s["max_rate_itl"] for s in rec["per_seed"]],
            "itl_ttft_per_seed": [s["max_rate_itl_ttft"] for s in rec["per_seed"]],
        }
    if sum(1 for c in a.cell_list if c.name.startswith("pd-cond-")) > 1:
        summary["best_min_uncached"], summary["best_min_uncached_rule"] = choose_min_uncached(summary["cells"])
    return summary


def dry_run(a: argparse.Namespace) -> int:
    """Each cell's configuration files (next to --out) and commands; nothing is started."""
    base = a.out.parent / f"{a.out.stem}-configs"
    ports = [8001, 8002]
    for c in a.cell_list:
        d = base / c.name
        d.mkdir(parents=True, exist_ok=True)
        routes, rcfg = cluster.write_configs(c, d, ports, a.prefill_timeout)
        sim = cluster.simulator_cmd(c, ports, 8100, a.time_scale, a.seed_list[0], a.kv_bandwidth_gbps,
                                    a.max_num_batched_tokens, a.sim_arg)
        rtr = cluster.router_cmd(routes, rcfg, 8080, 8081, a.router_arg)
        print(f"# {c.name}\n{' '.join(sim)}\n{' '.join(rtr)}")
    rates = ", ".join(f"{r:g} ({a.spec.requests_at(r)} req)" for r in a.rate_list)
    print(f"# rates: {rates}; seeds {a.seed_list}; configs in {base}")
    return 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        return dry_run(a)
    install_uvloop()
    signal.signal(signal.SIGTERM, _interrupt)  # the same clean-up path as Ctrl-C
    logdir = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    ok = False
    try:
        summary = asyncio.run(bench(a, logdir))
        md = report.write(a.out, summary)
        ok = not any(c.get("error") for c in summary["cells"])
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if a.keep_logs or not ok:
            print(f"logs: {logdir}", file=sys.stderr)
        else:
            shutil.rmtree(logdir, ignore_errors=True)
    print(md.read_text())
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
