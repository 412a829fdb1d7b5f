"""The cell loop shared by runner.py (the shared-prefix profiles) and hard_runner.py (the
hard workloads of issue 15): which policies run, the seed-major loop over (seed, policy)
cells, and the rejection of a cell whose figures would be the machine's, not the policy's.
A cell itself (start, drive, measure, stop) is each runner's own `CellFn`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cluster, policies, report
from .client import RunStats

Cell = dict[str, Any]
# (policy, its routerConfiguration or None, seed, the cell's log dir) -> (cell, accepted TTFTs)
CellFn = Callable[[policies.Policy, str | None, int, Path], Awaitable[tuple[Cell, list[float]]]]


def summary(a: argparse.Namespace, profile: str, workload: dict[str, Any]) -> dict[str, Any]:
    """The head of results.json; `tables` get one block per KV factor."""
    return {
        "profile": profile, "workload": workload, "time_scale": a.time_scale,
        "engines": cluster.N_ENGINES, "block_size": cluster.BLOCK_SIZE, "model": cluster.MODEL,
        "max_lag_fraction": a.max_lag, "seeds": a.seed_list, "router_args": a.router_arg,
        "tables": [],
    }


@dataclass(frozen=True)
class Verdict:
    sim_s: float  # the run's simulated duration
    lag_max: float  # the engines' worst lag behind the simulated clock (s)
    send_late: float  # how far the sender fell behind its schedule (simulated s)
    errors: dict[str, int]  # failed requests by error (first 120 characters)
    reason: str | None  # why the cell is rejected; None: accepted


def judge(stats: RunStats, states: list[dict[str, Any]], time_scale: float, max_lag: float) -> Verdict:
    """Accept a cell unless requests failed (a failed request frees its engine early: the
    figures would flatter the policy) or the engines or the sender fell behind schedule by
    more than `max_lag` of the run (the machine was CPU-starved). `states`: the engines'
    admin states at the end."""
    sim_s = stats.wall_s / time_scale
    lag_max = max(s["lag_max_seconds"] for s in states)
    send_late = stats.max_send_late_s / time_scale
    errors: dict[str, int] = {}
    for r in stats.results:
        if not r.ok:
            key = (r.error or "?")[:120]
            errors[key] = errors.get(key, 0) + 1
    reason = None
    if errors:
        top = max(errors, key=errors.__getitem__)
        reason = f"{sum(errors.values())} requests failed (most: {errors[top]} x {top})"
    elif lag_max > max_lag * sim_s:
        reason = f"engine lag {lag_max:.3f}s > {max_lag:.0%} of the {sim_s:.1f}s run"
    elif send_late > max_lag * sim_s:
        reason = f"sender {send_late:.3f}s behind schedule > {max_lag:.0%} of the run"
    return Verdict(sim_s, lag_max, send_late, errors, reason)


def add_engine_ttft(cell: Cell, ttfts: list[float], before: tuple[float, float],
                    after: tuple[float, float]) -> None:
    """Client TTFT minus the engines' own (`cluster.engine_ttft_totals` before and after):
    what the router (and the client) add per request. The lag check covers engines and
    sender only; a CPU-starved router shows here."""
    n_eng = after[1] - before[1]
    if ttfts and n_eng > 0:
        cell["engine_ttft_mean_s"] = (after[0] - before[0]) / n_eng
        cell["added_ttft_mean_ms"] = 1000.0 * (sum(ttfts) / len(ttfts) - cell["engine_ttft_mean_s"])


async def run_table(a: argparse.Namespace, block: dict[str, Any], logdir: Path, run_cell: CellFn,
                    cell_line: Callable[[Cell], str], dir_suffix: str = "",
                    refuse: Callable[[policies.Policy], str | None] = lambda pol: None,
                    ) -> tuple[dict[str, list[Cell]], dict[str, list[float]]]:
    """One table: every policy of --policies x every seed. A policy that cannot run here
    (`cluster.unavailable`, or `refuse`) gets a skipped row; the others run seed-major (the
    policies of one seed back to back, so that a busy spell on the shared machine hits
    every policy alike instead of all seeds of one policy), each cell printed with
    `cell_line`. Fills `block["rows"]`; returns the cells and the accepted cells' TTFTs
    per policy."""
    runnable = []
    for pol in a.policy_list:
        sched = a.overrides.get(pol.name, pol.scheduler_yaml)
        why = cluster.unavailable(pol, sched) or refuse(pol)
        if why is not None:
            print(f"skip {pol.name}: {why}", file=sys.stderr)
            block["rows"][pol.name] = {"skipped": why}
        else:
            runnable.append((pol, sched))
    cells: dict[str, list[Cell]] = {pol.name: [] for pol, _ in runnable}
    ttfts: dict[str, list[float]] = {}
    for seed in a.seed_list:
        for pol, sched in runnable:
            cell_dir = logdir / f"{pol.name}-s{seed}{dir_suffix}"
            cell_dir.mkdir(parents=True, exist_ok=True)
            cell, tt = await run_cell(pol, sched, seed, cell_dir)
            cells[pol.name].append(cell)
            print(cell_line(cell), file=sys.stderr, flush=True)
            if cell["accepted"]:
                ttfts.setdefault(pol.name, []).extend(tt)
    for pol, _ in runnable:
        good = [c for c in cells[pol.name] if c["accepted"]]
        block["rows"][pol.name] = {"seeds_run": len(cells[pol.name]), "seeds_ok": len(good),
                                   "aggregate": report.aggregate(good), "cells": cells[pol.name]}
    return cells, ttfts
