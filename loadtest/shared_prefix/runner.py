"""Shared-prefix routing benchmark: policies x seeds (x KV factors) on 3 simulated engines.

    python -m loadtest.shared_prefix.runner --profile ci \\
        --policies random,round-robin,greedy-reference --out results/
    python -m loadtest.shared_prefix.runner --profile ci --sweep --out results/sweep/

Each cell (policy, seed, KV factor) gets a fresh simulator (empty caches, lag counters
from zero) and, per policy, our router / a peer router / nothing (greedy-reference,
direct). The workload is sent over HTTP with streaming; TTFT and E2E are measured per
request at the client. Hit rate = delta prefix-cache hits / delta queries (tokens) summed over engines.
A cell is rejected when an engine's step loop or the sender fell behind schedule by
more than --max-lag (fraction of the run): the machine was CPU-starved, the figures
would be the machine's, not the policy's. A cell with failed requests is rejected too
(the reason names the commonest error). Outputs in --out: results.json, results.md,
ttft_kv<F>.png per KV factor, sweep.png with several factors.

Policies with kvcache-aware (listed, or prefix-cache with kvcache-aware's tokenizers: the
router's automatic exact matching) get engines started with --kv-events-port-base and Endpoints
labelled with each engine's event ports (kthena.io/kv-events-port, -replay-port); the cell
records the router's kvcache-aware fallback count (exact matching working: ~0). Tables run
in pieces merge with `python -m loadtest.shared_prefix.merge`.

Seeds: configurations are chosen on the tuning seeds (1,2,3, `--seeds tuning`) and
reported on other seeds (4,5,6, `--seeds report`, the default), so that a reported figure
is not one a configuration was picked for.

Time scale: the engines run `time_scale` times slower than wall time so that 2 cores
keep up; all reported times and rates are simulated (wall / time_scale).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.ports import free_port_block
from loadtest.procs import Proc, StartError, http
from loadtest.loadgen import install_uvloop
from . import cells, cluster, hard_runner, policies, report
from .client import Chooser, Result, RoundRobin, RunStats, drive
from .greedy import GreedyReference, group_prompt_tokens, prompt_shape
from .hard_workloads import HARD_PROFILES, with_overrides
from .workload import PROFILES, WorkloadSpec, arrival_times, generate, profile

# Wall seconds per simulated second, per profile: slow enough that 2 cores keep the
# simulated schedule (how they were chosen: docs/benchmarks.md, Setup).
DEFAULT_TIME_SCALE = {"published": 16.0, "small": 10.0, "ci": 6.0, "tiny": 2.0}
SWEEP_FACTORS = (0.25, 0.5, 1.0, 2.0)
SEED_SETS = {"tuning": (1, 2, 3), "report": (4, 5, 6)}


# workload overrides of the shared-prefix profiles (hard profiles: --set)
WORKLOAD_FLAGS: dict[str, type] = {
    "num-groups": int, "prompts-per-group": int, "system-prompt-len": int, "question-len": int,
    "output-len": int, "request-rate": float, "max-concurrency": int}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.shared_prefix.runner",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="ci", choices=[*PROFILES, *HARD_PROFILES],
                   help="hard workloads of issue 15: " + ", ".join(HARD_PROFILES)
                        + " (hard_workloads.py)")
    p.add_argument("--policies", default=None,
                   help=f"comma-separated (default: all; with --sweep: "
                        f"{','.join(policies.SWEEP_POLICIES)}); known: {', '.join(policies.POLICIES)}")
    p.add_argument("--seeds", default="report",
                   help="comma-separated, or 'tuning' (1,2,3: choose configurations on these) "
                        "or 'report' (4,5,6: report on these; default)")
    p.add_argument("--kv-factors", default=None,
                   help=f"KV capacity per engine, x computed (default {cluster.PUBLISHED_REGIME})")
    p.add_argument("--sweep", action="store_true",
                   help=f"KV factors {','.join(map(str, SWEEP_FACTORS))}")
    p.add_argument("--time-scale", type=float, default=None)
    p.add_argument("--max-lag", type=float, default=0.03,
                   help="reject a cell whose lag exceeds this fraction of the run")
    p.add_argument("--request-timeout", type=float, default=600.0, help="wall seconds")
    p.add_argument("--policy-config", action="append", default=[], metavar="NAME=PATH",
                   help="routerConfiguration file for a policy (replaces the table's); an "
                        "unknown NAME defines a candidate router policy to list in --policies")
    p.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                   help="extra CLI argument for our router, e.g. --router-arg=--hot-spot-abs=64")
    # workload overrides (default: the profile's)
    for f, t in WORKLOAD_FLAGS.items():
        p.add_argument(f"--{f}", type=t, default=None)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="hard profiles: override a field of the workload, e.g. --set rate=130")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    # --policy-config: a known name gets its YAML replaced; a new name is a candidate
    # router policy with that routerConfiguration (to compare variants in one run).
    a.overrides = {}
    extra: dict[str, policies.Policy] = {}
    for kv in a.policy_config:
        name, sep, path = kv.partition("=")
        if not sep or not name or not Path(path).is_file():
            p.error(f"--policy-config wants NAME=PATH with an existing file, got {kv!r}")
        text = Path(path).read_text()
        if name in policies.POLICIES:
            a.overrides[name] = text
        else:
            extra[name] = policies.Policy(name, "router", text, note=f"candidate: {path}",
                                          config_file=Path(path).resolve())
    names = a.policies.split(",") if a.policies else list(
        policies.HARD_POLICIES if a.profile in HARD_PROFILES else
        policies.SWEEP_POLICIES if a.sweep else policies.DEFAULT_POLICIES)
    try:
        a.policy_list = [extra.get(n.strip()) or policies.get(n.strip()) for n in names if n.strip()]
    except ValueError as e:
        p.error(str(e))
    try:
        a.seed_list = list(SEED_SETS.get(a.seeds) or
                           (int(s) for s in a.seeds.split(",") if s.strip()))
    except ValueError:
        p.error(f"--seeds wants 'tuning', 'report' or integers, got {a.seeds!r}")
    if a.kv_factors:
        a.kv_list = [float(x) for x in a.kv_factors.split(",")]
    else:
        a.kv_list = list(SWEEP_FACTORS) if a.sweep else [cluster.PUBLISHED_REGIME]
    a.hard_spec = None
    if a.profile in HARD_PROFILES:
        given = [f for f in WORKLOAD_FLAGS if getattr(a, f.replace("-", "_")) is not None]
        if given:  # these shape the shared-prefix profiles only; refused, not ignored
            p.error(f"--{', --'.join(given)}: not for hard profiles, use --set FIELD=VALUE")
        try:
            a.hard_spec = with_overrides(HARD_PROFILES[a.profile], a.set)
        except ValueError as e:
            p.error(str(e))
    elif a.set:
        p.error("--set applies to the hard profiles only")
    if a.time_scale is None:
        a.time_scale = (a.hard_spec.time_scale if a.hard_spec is not None
                        else DEFAULT_TIME_SCALE[a.profile])
    return a


class _Progress:
    def __init__(self, label: str, total: int, time_scale: float, quiet: bool) -> None:
        self.label, self.total, self.k, self.quiet = label, total, time_scale, quiet
        self.done = self.failed = 0
        self.t0 = time.perf_counter()

    def on_result(self, r: Result) -> None:
        self.done += 1
        self.failed += not r.ok

    def line(self, in_flight: int, lag_now: float, lag_max: float) -> None:
        if self.quiet:
            return
        wall = time.perf_counter() - self.t0
        rate = self.done / (wall / self.k) if wall > 0 else 0.0
        print(f"  [{self.label}] {self.done}/{self.total} done ({self.failed} failed), "
              f"{in_flight} in flight, {rate:.1f} req/s sim, engine lag {lag_now:.3f}s "
              f"(max {lag_max:.3f}s) sim", file=sys.stderr, flush=True)


def _totals(states: list[dict[str, Any]]) -> tuple[int, int]:
    hits = sum(r["prefix_hits_total"] for s in states for r in s["ranks"])
    queries = sum(r["prefix_queries_total"] for s in states for r in s["ranks"])
    return hits, queries


async def run_cell(a: argparse.Namespace, spec: WorkloadSpec, pol: policies.Policy,
                   sched_yaml: str | None, kv_factor: float, seed: int,
                   logdir: Path) -> tuple[dict[str, Any], list[float]]:
    """One (policy, seed, KV factor): start, drive, measure, stop. Returns (cell, ttfts)."""
    spec = replace(spec, seed=seed)
    k = a.time_scale
    blocks = cluster.kv_blocks(spec, kv_factor)
    procs: list[Proc] = []
    greedy: GreedyReference | None = None
    router_admins: list[str] = []
    kv_fallbacks: float | None = None
    shared: dict[str, float | None] | None = None
    served: list[float | None] | None = None
    hot_spot: float | None = None
    retries: float | None = None
    needs_events = pol.kv_events or policies.uses_kv_events(sched_yaml)
    try:
        ev_base = free_port_block(2 * cluster.N_ENGINES) if needs_events else None
        ports, admin = cluster.start_engines(logdir, procs, blocks, k, seed,
                                             kv_events_base=ev_base)
        admin_url = f"http://127.0.0.1:{admin}"
        engine_urls = [f"http://127.0.0.1:{p}" for p in ports]
        reqs = generate(spec)
        chooser: Chooser = Chooser()
        urls: list[str]
        if pol.kind == "router":
            if sched_yaml is not None:
                sched_yaml = cluster.with_sim_time_traffic(sched_yaml, k)
            if pol.shared_index:  # a fresh Redis per cell: the index starts empty, as the caches
                # syncInterval 50 ms of simulated time (wall = x time scale): the staleness a
                # real deployment at 50 ms would have, not one the slowed clock flatters
                sched_yaml = cluster.with_shared_index(sched_yaml, cluster.start_redis(logdir, procs),
                                                       f"{round(50 * k)}ms")
            url, router_admins = cluster.start_replicas(logdir, procs, ports, pol, sched_yaml,
                                                        kv_events_base=ev_base,
                                                        extra_args=tuple(a.router_arg))
            urls = [url]
        elif pol.kind == "peer":
            urls = [cluster.start_peer(logdir, procs, ports, pol.peer or "",
                                       policy=pol.peer_policy)]
        elif pol.kind == "direct":
            urls, chooser = engine_urls, RoundRobin(len(ports))
        else:
            same = [r for r in reqs if r.group == reqs[0].group][:2]
            shape = prompt_shape(same[0], same[-1])
            has_cache = http("GET", f"{admin_url}/admin/engines/0/cache")[0] == 200
            greedy = GreedyReference(admin_url, len(ports), blocks, cluster.BLOCK_SIZE, shape,
                                     spec.output_len, cluster.MAX_NUM_BATCHED_TOKENS,
                                     group_prompt_tokens(reqs, shape) if has_cache else None)
            greedy.start()
            urls, chooser = engine_urls, greedy
        states0 = await asyncio.to_thread(cluster.engine_states, admin_url)
        ttft0 = await asyncio.to_thread(cluster.engine_ttft_totals, engine_urls)
        label = f"{pol.name} seed={seed} kv=x{kv_factor:g}"
        prog = _Progress(label, len(reqs), k, a.quiet)
        offsets = [t * k for t in arrival_times(spec, len(reqs))]
        live = RunStats()
        run = asyncio.create_task(drive(reqs, offsets, urls, chooser, cluster.MODEL,
                                        spec.max_concurrency, a.request_timeout,
                                        prog.on_result, live))
        while not run.done():
            await asyncio.wait({run}, timeout=2.0)
            if not run.done():
                st = await asyncio.to_thread(cluster.engine_states, admin_url)
                prog.line(live.in_flight,
                          max(s["lag_seconds"] for s in st), max(s["lag_max_seconds"] for s in st))
        stats = run.result()
        states1 = await asyncio.to_thread(cluster.engine_states, admin_url)
        ttft1 = await asyncio.to_thread(cluster.engine_ttft_totals, engine_urls)
        if router_admins and needs_events:
            # requests that kvcache-aware scored without exact event data (should be ~0)
            kv_fallbacks = await asyncio.to_thread(
                _sum_counter, router_admins, "kthena_router_kvcache_aware_fallback_total")
        if router_admins and sched_yaml:
            # the hot-spot guard's reorders, published at the router's scrape pace (1 s)
            await asyncio.sleep(1.2)
            hot_spot = await asyncio.to_thread(
                _sum_counter, router_admins, "kthena_router_hot_spot_reorders_total")
        if router_admins:  # attempts that failed over (timeouts, errors): each a sign of trouble
            retries = await asyncio.to_thread(_sum_counter, router_admins, "kthena_router_retries_total")
        if router_admins and pol.shared_index:
            shared = {n: await asyncio.to_thread(_sum_counter, router_admins,
                                                 f"kthena_router_shared_index_{n}_total")
                      for n in ("published", "merged", "dropped", "redis_errors")}
        if router_admins and pol.replicas > 1:
            served = [await asyncio.to_thread(cluster.router_counter, u, "kthena_router_requests_total")
                      for u in router_admins]
    finally:
        if greedy is not None:
            await greedy.stop()
        for p in reversed(procs):
            p.stop()

    (h0, q0), (h1, q1) = _totals(states0), _totals(states1)
    ok = [r for r in stats.results if r.ok]
    verdict = cells.judge(stats, states1, k, a.max_lag)
    ttfts = [r.ttft_s / k for r in ok]
    cell = {
        "policy": pol.name, "seed": seed, "kv_factor": kv_factor, "kv_blocks": blocks,
        "accepted": verdict.reason is None, "reject_reason": verdict.reason,
        "requests": len(reqs), "completed": len(stats.results), "ok": len(ok),
        "errors": verdict.errors, "wall_s": stats.wall_s, "sim_duration_s": verdict.sim_s,
        "engine_lag_max_s": verdict.lag_max, "send_late_max_s": verdict.send_late,
        # the machine's 1-minute load average at the end (2 cores shared: a busy spell
        # slows the router, which the engines' lag check does not see)
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "prefix_hits": h1 - h0, "prefix_queries": q1 - q0,
        "preemptions": sum(r["preemptions_total"] for s in states1 for r in s["ranks"]),
        "metrics": report.cell_metrics(ttfts, [r.e2e_s / k for r in ok], verdict.sim_s, h1 - h0, q1 - q0),
    }
    # kept so that merged runs can redraw the TTFT distributions (merge.py)
    cell["ttft_samples_s"] = [round(x, 5) for x in ttfts]
    cells.add_engine_ttft(cell, ttfts, ttft0, ttft1)
    if hot_spot is not None:
        cell["hot_spot_reorders"] = hot_spot
    if retries is not None:
        cell["router_retries"] = retries
    if pol.replicas > 1:
        cell["replicas"] = pol.replicas
        cell["requests_per_replica"] = served  # haproxy's round-robin spread (probes included)
    if shared is not None:
        cell["shared_index"] = shared
    if needs_events:
        cell["kv_events"] = True
        cell["kvcache_aware_fallbacks"] = kv_fallbacks
    if greedy is not None:
        cell["greedy_cache_source"] = greedy.cache_source
    if pol.kind in ("greedy", "direct"):
        cell["per_engine_requests"] = [sum(1 for r in stats.results if r.target == i)
                                       for i in range(len(engine_urls))]
    return cell, ttfts


def _sum_counter(admin_urls: list[str], name: str) -> float | None:
    vals = [cluster.router_counter(u, name) for u in admin_urls]
    return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)


def _refuse(pol: policies.Policy) -> str | None:
    return "defined for the hard workloads only" if pol.kind == "partition" else None


def _cell_line(cell: dict[str, Any]) -> str:
    m = cell["metrics"]
    verdict = "ok" if cell["accepted"] else f"REJECTED ({cell['reject_reason']})"
    return (f"{cell['policy']} seed={cell['seed']} kv=x{cell['kv_factor']:g}: "
            f"{cell['ok']}/{cell['requests']} ok, "
            f"{m['req_s']:.2f} req/s, mean TTFT {m['ttft_mean_s'] or math.nan:.3f}s, "
            f"hit {100 * (m['hit_rate'] or 0):.1f}%, lag {cell['engine_lag_max_s']:.3f}s, "
            f"added TTFT {cell.get('added_ttft_mean_ms', math.nan):.1f} ms, "
            f"load {cell['load_avg_1m']:.1f}"
            + (f", router retries {cell['router_retries']:g}" if cell.get("router_retries") else "")
            + f" -> {verdict}")


async def bench(a: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    spec = profile(a.profile, num_groups=a.num_groups, prompts_per_group=a.prompts_per_group,
                   system_prompt_len=a.system_prompt_len, question_len=a.question_len,
                   output_len=a.output_len, request_rate=a.request_rate,
                   max_concurrency=a.max_concurrency)
    summary = cells.summary(a, a.profile, spec.to_json())
    a.out.mkdir(parents=True, exist_ok=True)
    for kv_factor in a.kv_list:
        block: dict[str, Any] = {"kv_factor": kv_factor,
                                 "kv_blocks": cluster.kv_blocks(spec, kv_factor), "rows": {}}
        summary["tables"].append(block)

        def run(pol: policies.Policy, sched: str | None, seed: int,
                cell_dir: Path) -> Awaitable[tuple[dict[str, Any], list[float]]]:
            return run_cell(a, spec, pol, sched, kv_factor, seed, cell_dir)

        _, ttfts = await cells.run_table(a, block, logdir, run, _cell_line, dir_suffix=f"-kv{kv_factor:g}",
                                         refuse=_refuse)
        if ttfts:
            report.plot_ttft(a.out / f"ttft_kv{kv_factor:g}.png", ttfts,
                             f"TTFT, profile {a.profile}, KV x{kv_factor:g}")
    if len(a.kv_list) > 1:
        report.plot_sweep(a.out / "sweep.png", summary)
    report.write_json(a.out / "results.json", summary)
    (a.out / "results.md").write_text(report.markdown(summary))
    return summary


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    install_uvloop()
    signal.signal(signal.SIGTERM, _interrupt)  # same clean-up path as Ctrl-C
    logdir = Path(tempfile.mkdtemp(prefix="shared-prefix-"))
    ok = False
    try:
        if a.profile in HARD_PROFILES:
            asyncio.run(hard_runner.bench(a, a.hard_spec, logdir))
        else:
            asyncio.run(bench(a, logdir))
        ok = True
    except StartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if a.keep_logs or not ok:
            print(f"logs: {logdir}", file=sys.stderr)
        else:
            shutil.rmtree(logdir, ignore_errors=True)
    print((a.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
