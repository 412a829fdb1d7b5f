"""Autoscaler benchmark (issue 13): a day-shaped trace, compressed, replayed through the
simulator; replica-seconds and SLO misses (TTFT above 2 s, simulated) per autoscaling
configuration (docs/autoscaler-benchmark.md).

A cell = one seed x one configuration: a fresh router in file mode in front of a pool of
simulated engines (one process per potential replica, started once per run), the real
algorithm (parse_policy, recommend_homogeneous) and collector (Collector.observe on
fabricated pods) once per period of the trace clock, replicas made active in the router's
config after the startup delay, and an open-loop client replaying the trace.

    python -m loadtest.bench_autoscaler --seeds 4,5 --configs stable,panic \
        --peak-rate 12 --target-waiting 2 --day-s 300 --out results/autoscaler
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any

from controller.autoscaler import ScalerState, parse_policy, recommend_homogeneous
from loadtest.autoscale_cluster import (MODEL, MS_NAME, NAMESPACE, ReplicaPool, RouterHandle, engine_ips,
                                        start_engines, start_router)
from loadtest.autoscale_configs import CONFIGS, BenchConfig, make_config
from loadtest.autoscale_trace import DAY_S, TraceSpec, generate, hour_of
from loadtest.pd_bench.client import Result, drive
from loadtest.procs import Proc, free_ports, tree_cpu_s

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROUTER_CONFIG = REPO / "configs" / "scheduling" / "best.yaml"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# ------------------------------------------------------------------------ one cell


class Cell:
    """One seed x configuration: the autoscaler loop next to the trace replay."""

    def __init__(self, cfg: BenchConfig, spec: TraceSpec, args: argparse.Namespace, router: RouterHandle,
                 ips: list[str], engines: list[Proc]) -> None:
        self.cfg, self.spec, self.args, self.router = cfg, spec, args, router
        self.policy = parse_policy(cfg.spec)
        self.comp = spec.compression  # trace seconds per simulated second
        self.pool = ReplicaPool(ips, args.startup_s / self.comp)
        self.pool.start(args.min_replicas, 0.0)
        self.timeline: list[dict[str, Any]] = []
        self.reloads = 0
        self.round_late_max = 0.0  # simulated seconds a round started after its due time
        self._t0 = 0.0
        self._lock = asyncio.Lock()
        self.cpu_roots = {"router": router.proc.pid, **{f"engine{i}": p.pid for i, p in enumerate(engines)}}
        self.cpu: dict[str, float] = {}

    def sim_now(self) -> float:
        return (time.perf_counter() - self._t0) / self.args.time_scale

    async def _apply(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.router.apply, self.pool.active_ips())
            self.reloads += 1

    async def _autoscaler(self, stop: asyncio.Event) -> None:
        collector = self.cfg.collector(self.args.scrape_timeout, f"{self.router.admin_url}/metrics", self.sim_now,
                                       self.args.router_rate_window_s)
        period = self.args.period_s / self.comp  # simulated seconds
        metric = next(iter(self.policy.metrics))
        state, due = ScalerState(), 0.0
        try:
            while not stop.is_set():
                now = self.sim_now()
                if self.pool.tick(now):
                    await self._apply()
                if now >= due:
                    self.round_late_max = max(self.round_late_max, now - due)
                    obs = await collector.observe(self.pool.pods(), NAMESPACE, MS_NAME, None, self.policy.metrics,
                                                  self.cfg.sources)
                    now = self.sim_now()
                    before = self.pool.current
                    rec, state = recommend_homogeneous(self.policy, state, obs, before, now * self.comp)
                    if not rec.skipped and rec.replicas != before and self.pool.scale_to(rec.replicas, now):
                        await self._apply()
                    sample = obs.metrics.get(metric)
                    self.timeline.append({
                        "t_sim": round(now, 3), "hour": round(now / (self.spec.day_s / 24), 3),
                        "current": before, "replicas": self.pool.current, "active": len(self.pool.active_ips()),
                        "desired": rec.desired, "mode": rec.mode, "skipped": rec.skipped,
                        "metric_sum": None if sample is None else round(sum(sample.pods) + (sample.external or 0), 3),
                        "reason": rec.reason,
                    })
                    due = max(due + period, now)  # a late round is not repeated
                nxt = min([due, *(self.pool.replicas[i].ready_at for i in self.pool.order
                                  if self.pool.replicas[i].state == "starting")])
                wait = max(0.0, (nxt - self.sim_now()) * self.args.time_scale)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=min(wait, 1.0))
                except asyncio.TimeoutError:
                    pass
        finally:
            await collector.close()

    async def run(self) -> dict[str, Any]:
        requests = generate(self.spec)
        stop = asyncio.Event()
        load0 = os.getloadavg()[0]
        cpu0 = time.process_time(), tree_cpu_s(self.cpu_roots)
        self._t0 = time.perf_counter()
        scaler = asyncio.create_task(self._autoscaler(stop))
        try:
            run = await drive(requests, self.args.time_scale, self.router.url, MODEL,
                              timeout_s=self.args.request_timeout, max_concurrency=self.args.max_concurrency)
        finally:
            stop.set()
            await scaler
        wall = time.perf_counter() - self._t0
        trees = tree_cpu_s(self.cpu_roots)
        self.cpu = {"wall_s": round(wall, 1), "bench_cpu_s": round(time.process_time() - cpu0[0], 1),
                    **{f"{k}_cpu_s": round(v - cpu0[1][k], 1) for k, v in trees.items()}}
        return self.summary(requests, run.results, run.max_send_late_s, load0)

    def summary(self, requests: list[Any], results: list[Result], send_late: float, load0: float) -> dict[str, Any]:
        ts, slo, spec = self.args.time_scale, self.args.slo_ttft_s, self.spec
        offset = {r.index: r.offset_s for r in requests}
        ok = [r for r in results if r.ok]
        ttft = [r.ttft_s / ts for r in ok]
        hours: dict[int, list[float]] = {}
        for r in ok:
            hours.setdefault(hour_of(spec, offset[r.index]), []).append(r.ttft_s / ts)
        hour_p99 = {h: percentile(v, 99) for h, v in sorted(hours.items())}
        errors: dict[str, int] = {}
        for r in results:
            if not r.ok:
                key = (r.error or "?")[:80]
                errors[key] = errors.get(key, 0) + 1
        rs = self.pool.replica_seconds(spec.day_s)
        replicas = [p["replicas"] for p in self.timeline]
        return {
            "config": self.cfg.name, "seed": spec.seed, "policy": self.cfg.spec,
            "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok), "error_kinds": errors,
            "slo_misses": sum(1 for x in ttft if x > slo) + len(results) - len(ok),
            "slo_miss_rate": (sum(1 for x in ttft if x > slo) + len(results) - len(ok)) / max(1, len(results)),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "hours_p99_over_slo": sum(1 for v in hour_p99.values() if v > slo),
            "hour_p99_s": {str(h): round(v, 3) for h, v in hour_p99.items()},
            "replica_seconds_sim": rs, "replica_hours_trace": rs * self.comp / 3600,
            "mean_replicas": rs / spec.day_s, "max_replicas": max(replicas, default=self.args.min_replicas),
            "rounds": len(self.timeline), "reloads": self.reloads,
            "panic_rounds": sum(1 for p in self.timeline if p["mode"] == "Panic"),
            "max_send_late_s_wall": send_late, "max_round_late_s_sim": self.round_late_max,
            "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "cpu": {"wall_s": self.cpu["wall_s"], "bench_cpu_s": self.cpu["bench_cpu_s"],
                    "router_cpu_s": self.cpu["router_cpu_s"],
                    "engines_cpu_s": round(sum(v for k, v in self.cpu.items() if k.startswith("engine")), 1)},
            "timeline": self.timeline,
        }


# ------------------------------------------------------------------------ the run


def engine_args(args: argparse.Namespace) -> list[str]:
    return ["--time-scale", str(args.time_scale), "--max-num-seqs", str(args.max_num_seqs),
            *shlex.split(args.sim_args)]


def target_of(args: argparse.Namespace, name: str) -> float:
    value = args.target_tokens if name == "router" else args.target_waiting
    if value is None:
        raise SystemExit(f"configuration {name!r} needs --{'target-tokens' if name == 'router' else 'target-waiting'}")
    return value


async def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: Path = args.out
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    ips = engine_ips(args.max_replicas)
    port = free_ports(1)[0]
    procs: list[Proc] = []
    cells: list[dict[str, Any]] = []
    configs = [c for c in args.configs.split(",") if c]
    try:
        start_engines(ips, port, engine_args(args), logdir, procs)
        for seed in (int(s) for s in args.seeds.split(",")):
            spec = TraceSpec(day_s=args.day_s, peak_rate=args.peak_rate, seed=seed)
            for name in configs:  # seed-major: a busy spell hits the configurations of a seed alike
                cfg = make_config(name, target_of(args, name), args.min_replicas, args.max_replicas, port)
                cell_log = logdir / f"seed{seed}-{name}"
                cell_log.mkdir(exist_ok=True)
                router_procs: list[Proc] = []
                router = start_router(cell_log, port, ips[:args.min_replicas], args.router_config,
                                      shlex.split(args.router_args), router_procs)
                try:
                    res = await Cell(cfg, spec, args, router, ips, procs).run()
                finally:
                    for p in router_procs:
                        p.stop()
                cells.append(res)
                print(json.dumps({k: v for k, v in res.items() if k not in ("timeline", "policy", "hour_p99_s")}),
                      flush=True)
                write_results(out, args, cells)
    finally:
        for p in procs:
            p.stop()
    return cells


def _fmt(v: float, nd: int = 2) -> str:
    return "-" if v != v else f"{v:.{nd}f}"


def markdown(cells: list[dict[str, Any]], args: argparse.Namespace) -> str:
    comp = DAY_S / args.day_s
    lines = [
        f"Trace: day = {args.day_s:g} simulated s (x{comp:g}), peak {args.peak_rate:g} req/s (simulated), "
        f"period {args.period_s:g} trace s, startup {args.startup_s:g} trace s "
        f"({args.startup_s / comp:.3g} simulated s), replicas {args.min_replicas}..{args.max_replicas}, "
        f"engine max-num-seqs {args.max_num_seqs}, time scale {args.time_scale:g}, SLO TTFT > {args.slo_ttft_s:g} s.",
        "",
        "| seed | config | requests | errors | SLO misses (rate) | hours p99 > SLO | TTFT p50 / p99 (s) "
        "| replica-s (sim) | replica-h (trace) | mean / max replicas | panic rounds | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        lines.append(
            f"| {c['seed']} | {c['config']} | {c['requests']} | {c['errors']} | {c['slo_misses']} "
            f"({100 * c['slo_miss_rate']:.1f}%) | {c['hours_p99_over_slo']} | {_fmt(c['ttft_p50_s'])} / "
            f"{_fmt(c['ttft_p99_s'])} | {c['replica_seconds_sim']:.0f} | {c['replica_hours_trace']:.1f} | "
            f"{c['mean_replicas']:.2f} / {c['max_replicas']} | {c['panic_rounds']} | "
            f"{c['load_avg_1m'][0]}-{c['load_avg_1m'][1]} |")
    lines += ["", "Run conditions (CPU seconds over the cell's wall time; lags: how far the client's sends and the "
              "autoscaler's rounds fell behind schedule):", "",
              "| seed | config | wall s | CPU s bench / router / engines | send lag (wall s) | round lag (sim s) "
              "| rounds | reloads |", "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        u = c["cpu"]
        lines.append(f"| {c['seed']} | {c['config']} | {u['wall_s']} | {u['bench_cpu_s']} / {u['router_cpu_s']} / "
                     f"{u['engines_cpu_s']} | {c['max_send_late_s_wall']:.3f} | {c['max_round_late_s_sim']:.3f} | "
                     f"{c['rounds']} | {c['reloads']} |")
    by: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        by.setdefault(c["config"], []).append(c)
    if len({c["seed"] for c in cells}) > 1:
        lines += ["", "| config | seeds | SLO misses (sum) | hours p99 > SLO (sum) | replica-h trace (mean) |",
                  "|---|---|---|---|---|"]
        for name, cs in by.items():
            lines.append(f"| {name} | {len(cs)} | {sum(c['slo_misses'] for c in cs)} | "
                         f"{sum(c['hours_p99_over_slo'] for c in cs)} | "
                         f"{sum(c['replica_hours_trace'] for c in cs) / len(cs):.1f} |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, args: argparse.Namespace, cells: list[dict[str, Any]]) -> None:
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    trace = TraceSpec(day_s=args.day_s, peak_rate=args.peak_rate, seed=0).to_json()
    (out / "results.json").write_text(json.dumps({"args": meta, "trace": trace, "cells": cells}, indent=1))
    (out / "results.md").write_text(markdown(cells, args))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="stable,panic", help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--seeds", default="4,5,6", help="report seeds 4-6; choose targets on 1-3")
    p.add_argument("--peak-rate", type=float, required=True, help="req/s (simulated) at the trace's peak")
    p.add_argument("--target-waiting", type=float, help="targetValue of num_requests_waiting (stable, panic)")
    p.add_argument("--target-tokens", type=float, help="targetValue of router:tokens_per_second (router)")
    p.add_argument("--router-rate-window-s", type=float, default=1.0,
                   help="router: tokens/s over at least this many simulated s (not compressed: one request's "
                        "tokens are counted at its end)")
    p.add_argument("--day-s", type=float, default=300.0, help="simulated seconds per trace day")
    p.add_argument("--period-s", type=float, default=15.0, help="autoscaler period, trace s (Kthena: 15)")
    p.add_argument("--startup-s", type=float, default=120.0, help="replica request -> Ready, trace s")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=6, help="also the engine pool size")
    p.add_argument("--max-num-seqs", type=int, default=4, help="per engine (small: the machine has 2 cores)")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulator: wall s per simulated s")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--scrape-timeout", type=float, default=3.0)
    p.add_argument("--request-timeout", type=float, default=300.0, help="wall s")
    p.add_argument("--max-concurrency", type=int, default=1024, help="client safety cap")
    p.add_argument("--sim-args", default="", help="extra simulator arguments")
    p.add_argument("--router-config", type=Path, default=DEFAULT_ROUTER_CONFIG)
    p.add_argument("--router-args", default="--health-probe-interval-s=3600")
    p.add_argument("--out", type=Path, default=Path("results/autoscaler"))
    args = p.parse_args(argv)
    for c in args.configs.split(","):
        if c and c not in CONFIGS:
            p.error(f"unknown configuration {c!r}")
    if args.max_replicas < args.min_replicas or args.min_replicas < 1:
        p.error("need 1 <= --min-replicas <= --max-replicas")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cells = asyncio.run(run_all(args))
    print(markdown(cells, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
