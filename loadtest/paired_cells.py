"""Latency cells whose requests rotate over every target one by one (bench_overhead --paired).

At low concurrency the machine's own noise (a scheduler hiccup, another process's burst)
moves a cell's p99 by more than any router adds, and cells run one after another meet
different noise: the added p99 at c=1 then changes sign between repeats. Here one closed
loop sends request k to target k mod T (direct, each router, each peer), so every target's
percentiles come from the same seconds and the noise falls on all of them alike.

Latency only. Each router serves a T-th of the request rate here, so its background work
(scrapes, probes) would weigh T times more in CPU per request, and a shared window has no
per-target throughput: those figures stay with the sequential cells.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from loadtest.loadgen import LoadGen, PhaseResult, Sample, chat_body, summarize

DIRECT = "direct"
PCTS = ("p50", "p99", "p999")


def rotation(targets: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(urls, owner of each url): position k belongs to target k mod T; a target with
    several urls (direct: one per engine) cycles through them."""
    names = list(targets)
    width = max(len(urls) for urls in targets.values())
    urls = [targets[n][j % len(targets[n])] for j in range(width) for n in names]
    return urls, [n for _ in range(width) for n in names]


def split(samples: list[Sample], owners: list[str]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {n: [] for n in dict.fromkeys(owners)}
    for s in samples:
        out[owners[s.target]].append(s)
    return out


async def run_paired(a: Any, mode: str, conc: int, targets: dict[str, list[str]], engines: Any) -> list[dict]:
    """One cell per target, all measured in the same window."""
    engines.reset()
    urls, owners = rotation(targets)
    gen = LoadGen(urls, conc, body=chat_body(a.model, a.max_tokens, stream=mode == "stream"),
                  client=a.client, timeout_s=a.request_timeout, headers=dict(a.header))
    try:
        await asyncio.wait_for(gen.run(requests=max(a.warmup, 3 * conc * len(urls))), a.cell_timeout)
        n = None if a.requests is None else a.requests * len(targets)
        res = await asyncio.wait_for(gen.run(requests=n, duration_s=a.duration), a.cell_timeout)
    finally:
        await gen.close()
    cells = []
    for name, samples in split(res.samples, owners).items():
        cell = summarize(PhaseResult(samples, res.wall_s))
        for k in ("rps", "client_cpu_ms_per_req"):  # not per target in a shared window
            cell.pop(k)
        cells.append({"target": name, "mode": mode, "concurrency": conc, "pairing": "request", **cell})
    return cells


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def compare(cells: list[dict]) -> dict:
    """router -> mode -> concurrency -> added p50/p99/p99.9 (median over repeats, and each
    repeat's value), the target's percentile minus direct's in the same window."""
    ix = {(c.get("repeat", 0), c["target"], c["mode"], c["concurrency"]): c for c in cells}
    out: dict = {}
    for (rep, t, m, conc), c in sorted(ix.items(), key=lambda kv: kv[0]):
        d = ix.get((rep, DIRECT, m, conc))
        if t == DIRECT or d is None:
            continue
        row = out.setdefault(t, {}).setdefault(m, {}).setdefault(str(conc), {})
        for pct in PCTS:
            a, b = c["latency_ms"][pct], d["latency_ms"][pct]
            if a is not None and b is not None:
                row.setdefault(f"added_{pct}_ms_runs", []).append(a - b)
    for per_mode in out.values():
        for per_c in per_mode.values():
            for row in per_c.values():
                for pct in PCTS:
                    row[f"added_{pct}_ms"] = _median(row.get(f"added_{pct}_ms_runs", []))
    return out
