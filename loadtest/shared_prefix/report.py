"""Cell metrics, aggregation over seeds, Markdown/JSON tables and PNG plots.

All times in the tables are simulated seconds (client wall time / time scale), i.e. what
the modelled H200 deployment would show; req/s likewise per simulated second.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadtest.loadgen import percentile

METRICS = ("req_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_mean_s",
           "hit_rate")
HEADERS = ("req/s", "mean TTFT (s)", "p50 TTFT", "p90 TTFT", "p99 TTFT", "mean E2E (s)",
           "cache hit rate")


def cell_metrics(ttfts_s: list[float], e2es_s: list[float], sim_duration_s: float,
                 hits: int, queries: int) -> dict[str, float | None]:
    t = sorted(ttfts_s)
    n = len(e2es_s)
    return {
        "req_s": n / sim_duration_s if sim_duration_s > 0 else 0.0,
        "ttft_mean_s": sum(t) / len(t) if t else None,
        "ttft_p50_s": percentile(t, 0.5) if t else None,
        "ttft_p90_s": percentile(t, 0.9) if t else None,
        "ttft_p99_s": percentile(t, 0.99) if t else None,
        "e2e_mean_s": sum(e2es_s) / n if n else None,
        "hit_rate": hits / queries if queries > 0 else None,
    }


def aggregate(cells: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """metric -> {mean, min, max} over the accepted cells (seeds) of one policy."""
    out: dict[str, dict[str, float | None]] = {}
    for m in METRICS:
        vals = [c["metrics"][m] for c in cells if c["metrics"].get(m) is not None]
        out[m] = ({"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)}
                  if vals else {"mean": None, "min": None, "max": None})
    return out


def _fmt(v: float | None, m: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if m == "hit_rate":
        return f"{100 * v:.1f}%"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def markdown(summary: dict[str, Any]) -> str:
    """One table per KV factor: rows = policies, cells = mean (min-max over seeds)."""
    parts: list[str] = []
    for block in summary["tables"]:
        parts.append(f"### KV x{block['kv_factor']:g} ({block['kv_blocks']} blocks/engine), "
                     f"profile {summary['profile']}, time scale {summary['time_scale']:g}\n")
        parts.append("| policy | seeds | " + " | ".join(HEADERS) + " |")
        parts.append("|---" * (len(HEADERS) + 2) + "|")
        for name, row in block["rows"].items():
            if row.get("skipped"):
                parts.append(f"| {name} | - | skipped: {row['skipped']} |" + " |" * (len(HEADERS) - 1))
                continue
            agg = row["aggregate"]
            cells = [f"{_fmt(agg[m]['mean'], m)} ({_fmt(agg[m]['min'], m)}-{_fmt(agg[m]['max'], m)})"
                     if row["seeds_ok"] > 1 else _fmt(agg[m]["mean"], m) for m in METRICS]
            seeds = f"{row['seeds_ok']}/{row['seeds_run']}"
            parts.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def write_json(path: Path, summary: dict[str, Any]) -> None:
    path.write_text(json.dumps(summary, indent=2, allow_nan=False))


def plot_ttft(path: Path, ttfts: dict[str, list[float]], title: str) -> bool:
    """CDF of TTFT per policy (all seeds pooled). False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, vals in ttfts.items():
        v = sorted(x for x in vals if x > 0)
        if v:
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (simulated s, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _color_index(i: int) -> int:
    """tab20: the 10 dark shades first, then the 10 light ones (distinct up to 20)."""
    return (2 * i) % 20 + (i // 10) % 2


def plot_sweep(path: Path, summary: dict[str, Any]) -> bool:
    """req/s and mean TTFT against the KV factor, one line per policy (min-max bars)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    names = sorted({n for b in summary["tables"] for n in b["rows"]})
    # the default cycle has 10 colours: 11+ policies would share one
    colors = plt.get_cmap("tab20").colors
    for ax, m, label in ((axes[0], "req_s", "req/s"), (axes[1], "ttft_mean_s", "mean TTFT (s)")):
        for name in names:
            xs, ys, lo, hi = [], [], [], []
            for b in summary["tables"]:
                row = b["rows"].get(name)
                if not row or row.get("skipped") or row["aggregate"][m]["mean"] is None:
                    continue
                a = row["aggregate"][m]
                xs.append(b["kv_factor"])
                ys.append(a["mean"])
                lo.append(a["mean"] - a["min"])
                hi.append(a["max"] - a["mean"])
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=name,
                            color=colors[_color_index(names.index(name))])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV capacity per engine (x computed)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"KV-capacity sweep, profile {summary['profile']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
