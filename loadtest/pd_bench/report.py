"""Phase metrics, the highest rate within the ITL objective, Markdown and JSON.

All times are simulated (client wall time / time scale): what the modelled H200
deployment would show; rates are requests per simulated second.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadtest.loadgen import percentile

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def dist_ms(values_s: list[float]) -> dict[str, float | None]:
    v = sorted(x * 1000.0 for x in values_s if x == x)
    if not v:
        return {name: None for name, _ in QUANTILES} | {"mean": None, "n": 0}
    return {name: percentile(v, q) for name, q in QUANTILES} | {"mean": sum(v) / len(v), "n": len(v)}


def passes(phase: dict[str, Any], itl_slo_ms: float, ttft_slo_ms: float | None) -> bool | None:
    """Whether a phase met the objective; None: it cannot tell (not run, or not valid)."""
    if phase.get("skipped") or not phase.get("valid"):
        return None
    if phase["failed"] > 0 or phase["itl_ms"]["p99"] is None:
        return False
    if phase["itl_ms"]["p99"] > itl_slo_ms:
        return False
    return ttft_slo_ms is None or (phase["ttft_ms"]["p99"] or math.inf) <= ttft_slo_ms


def max_rate(phases: list[dict[str, Any]], itl_slo_ms: float, ttft_slo_ms: float | None = None) -> float | None:
    """Highest rate such that it and every lower rate met the objective (None: not even
    the lowest). A phase that cannot tell (lagged, skipped) ends the scan."""
    best = None
    for ph in sorted(phases, key=lambda p: p["rate"]):
        if passes(ph, itl_slo_ms, ttft_slo_ms) is not True:
            break
        best = ph["rate"]
    return best


def _f(v: float | None, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def _rate(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def markdown(summary: dict[str, Any]) -> str:
    itl_slo, ttft_slo = summary["itl_slo_ms"], summary["ttft_slo_ms"]
    lines = [f"Seeds {summary['seeds']}, time scale {summary['time_scale']:g}; times in simulated "
             f"ms, pooled over seeds; rates in req/s (simulated).", ""]
    lines.append(f"| cell | rate | ok/sent | achieved req/s | TTFT p50 | p90 | p99 | ITL p50 | p90 | "
                 f"p99 | decode alone | notes |")
    lines.append("|---" * 12 + "|")
    for cell in summary["cells"]:
        if cell.get("error"):
            lines.append(f"| {cell['name']} | - | - | - | - | - | - | - | - | - | - | "
                         f"error: {cell['error'][:120]} |")
            continue
        for ph in cell["pooled"]:
            if ph.get("skipped"):
                lines.append(f"| {cell['name']} | {ph['rate']:g} | - | - | - | - | - | - | - | - | - | "
                             f"{ph['skipped']} |")
                continue
            t, i = ph["ttft_ms"], ph["itl_ms"]
            alone = ph.get("decode_alone")
            alone_s = f"{alone}/{ph['ok']}" if alone is not None else "-"
            notes = "; ".join(ph.get("notes", []))
            lines.append(f"| {cell['name']} | {ph['rate']:g} | {ph['ok']}/{ph['sent']} | "
                         f"{_f(ph['achieved_req_s'], 2)} | {_f(t['p50'], 0)} | {_f(t['p90'], 0)} | "
                         f"{_f(t['p99'], 0)} | {_f(i['p50'])} | {_f(i['p90'])} | {_f(i['p99'])} | "
                         f"{alone_s} | {notes} |")
    lines += ["", f"Highest rate with p99 ITL <= {itl_slo:g} ms (and with p99 TTFT <= "
                  f"{ttft_slo:g} ms as well), pooled and per seed:", "",
              "| cell | ITL only (pooled) | per seed | ITL + TTFT (pooled) | per seed |",
              "|---|---|---|---|---|"]
    for cell in summary["cells"]:
        if cell.get("error"):
            continue
        m = cell["max_rate"]
        lines.append(f"| {cell['name']} | {_rate(m['itl'])} | "
                     f"{' / '.join(_rate(x) for x in m['itl_per_seed'])} | {_rate(m['itl_ttft'])} | "
                     f"{' / '.join(_rate(x) for x in m['itl_ttft_per_seed'])} |")
    if summary.get("best_min_uncached") is not None:
        lines += ["", f"Best minUncachedTokens on these seeds: {summary['best_min_uncached']} "
                      f"({summary['best_min_uncached_rule']})"]
    return "\n".join(lines) + "\n"


def write(out: Path, summary: dict[str, Any]) -> Path:
    """out.json and, next to it, the Markdown (out.md)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, allow_nan=False))
    md = out.with_suffix(".md")
    md.write_text(markdown(summary))
    return md
