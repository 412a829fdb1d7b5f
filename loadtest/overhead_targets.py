"""The overhead targets of issues 8 and 14, checked run by run on bench_overhead's cells.

Each check compares one of our router configurations with a peer in the same repeat (the
cells of a repeat are interleaved, so drift and foreign load hit both alike). Added
latency = the target's percentile minus the direct (no router) cell's in that repeat.

- issue 8 (tail): added p99 at the highest concurrency at most 2x sglang-router's; at
  the lowest concurrency at most 2x vllm-router's; streamed and non-streamed (the issue's
  table has both).
- issue 14 (front end at Rust speed): added p50 at the lowest concurrency (streamed) at
  or below sglang-router's; CPU per streamed request at or below vllm-router's at the
  lowest and the highest concurrency; non-streamed req/s at the highest concurrency at
  least sglang-router's.

A check is None when its peer did not run. `all_runs` holds a check only if it held in
every repeat. With paired cells (loadtest/paired_cells.py: every target's requests
interleaved one by one in one window), the lowest concurrency's latency checks use those:
at c=1 the noise between sequential cells is larger than what a router adds.
"""

from __future__ import annotations

from collections.abc import Iterable

SGLANG = "sglang+nodelay"
VLLM = "vllm"
DIRECT = "direct"
TAIL_FACTOR = 2.0


def _index(cells: Iterable[dict]) -> dict[tuple[int, str, str, int], dict]:
    return {(c.get("repeat", 0), c["target"], c["mode"], c["concurrency"]): c for c in cells}


def _added(ix: dict, run: int, target: str, mode: str, conc: int, pct: str) -> float | None:
    c, d = ix.get((run, target, mode, conc)), ix.get((run, DIRECT, mode, conc))
    if c is None or d is None:
        return None
    return c["latency_ms"][pct] - d["latency_ms"][pct]


def _cpu(ix: dict, run: int, target: str, mode: str, conc: int) -> float | None:
    c = ix.get((run, target, mode, conc))
    return None if c is None else c["cpu_ms_per_req"].get(target)


def _le(a: float | None, b: float | None, factor: float = 1.0) -> bool | None:
    if a is None or b is None:
        return None
    # a non-positive reference (the peer added nothing measurable) is met only by the same
    return a <= factor * b if b > 0 else a <= b


def run_checks(ix: dict, run: int, ours: str, lo: int, hi: int, pix: dict | None = None) -> dict[str, bool | None]:
    rps = {t: (ix[(run, t, "plain", hi)]["rps"] if (run, t, "plain", hi) in ix else None) for t in (ours, SGLANG)}

    def low(mode: str) -> dict:  # cells for latency at the lowest concurrency: paired when there are
        return pix if pix and (run, DIRECT, mode, lo) in pix else ix

    checks: dict[str, bool | None] = {}
    for mode in ("stream", "plain"):
        checks[f"issue8_added_p99_hi_{mode}_le_2x_sglang"] = _le(
            _added(ix, run, ours, mode, hi, "p99"), _added(ix, run, SGLANG, mode, hi, "p99"), TAIL_FACTOR)
        checks[f"issue8_added_p99_lo_{mode}_le_2x_vllm"] = _le(
            _added(low(mode), run, ours, mode, lo, "p99"), _added(low(mode), run, VLLM, mode, lo, "p99"), TAIL_FACTOR)
    return checks | {
        "issue14_added_p50_lo_stream_le_sglang":
            _le(_added(low("stream"), run, ours, "stream", lo, "p50"), _added(low("stream"), run, SGLANG, "stream", lo, "p50")),
        "issue14_cpu_lo_stream_le_vllm": _le(_cpu(ix, run, ours, "stream", lo), _cpu(ix, run, VLLM, "stream", lo)),
        "issue14_cpu_hi_stream_le_vllm": _le(_cpu(ix, run, ours, "stream", hi), _cpu(ix, run, VLLM, "stream", hi)),
        "issue14_rps_hi_plain_ge_sglang": _le(rps[SGLANG], rps[ours]),
    }


def targets(cells: list[dict], ours: Iterable[str], concs: list[int], paired: list[dict] | None = None) -> dict:
    """{"per_run": [{router: {check: bool|None}}], "all_runs": {router: {check: bool|None}}}."""
    ix, pix = _index(cells), _index(paired or [])
    lo, hi = min(concs), max(concs)
    runs = sorted({k[0] for k in ix})
    per_run = [{o: run_checks(ix, r, o, lo, hi, pix) for o in ours} for r in runs]
    all_runs: dict[str, dict[str, bool | None]] = {}
    for o in ours:
        merged: dict[str, bool | None] = {}
        for checks in (pr[o] for pr in per_run):
            for k, v in checks.items():
                prev = merged.get(k, True)
                merged[k] = None if v is None or prev is None else prev and v
        all_runs[o] = merged
    return {"per_run": per_run, "all_runs": all_runs}
