"""Plots of the hard workloads' results: TTFT CDF per policy and per-engine queue over time.

The runner draws them when matplotlib is importable; the project's venv may lack it
(a `bench` extra), so they can be redrawn from results.json with any Python that has it:

    python -m loadtest.shared_prefix.hard_plots results/hard/zipf ... --out docs/img
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import report


def plot_load(path: Path, rows: dict[str, list[dict[str, Any]]], title: str) -> bool:
    """Per-engine queue (running + waiting) over time, one panel per policy (first seed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [n for n, cells in rows.items() if cells]
    if not names:
        return False
    cols = 2
    nrows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(11, 2.6 * nrows), squeeze=False,
                             sharex=True)
    for ax, name in zip(axes.flat, names):
        tl = rows[name][0]["queue_timeline"]
        if tl:
            ts = [t for t, _ in tl]
            for e in range(len(tl[0][1])):
                ax.plot(ts, [q[e] for _, q in tl], label=f"engine {e}")
        ax.set_title(name, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.set_ylabel("running+waiting", fontsize=8)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("simulated s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def redraw(result_dir: Path, out: Path) -> list[Path]:
    """TTFT CDF (accepted cells) and queue timelines (first cell per policy) of one run."""
    summary = json.loads((result_dir / "results.json").read_text())
    name = summary["profile"]
    rows = {n: r.get("cells", []) for n, r in summary["tables"][0]["rows"].items()}
    ttfts = {n: [x for c in cells if c["accepted"] for x in c["ttft_samples_s"]]
             for n, cells in rows.items()}
    ttft_png, load_png = out / f"hard_{name}_ttft.png", out / f"hard_{name}_load.png"
    report.plot_ttft(ttft_png, {n: v for n, v in ttfts.items() if v},
                     f"TTFT (accepted cells), workload {name}, time scale "
                     f"{summary['time_scale']:g}")
    plot_load(load_png, rows, f"Per-engine queue over time, workload {name}")
    return [ttft_png, load_png]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.shared_prefix.hard_plots")
    p.add_argument("dirs", nargs="+", type=Path, help="runner --out directories")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for d in a.dirs:
        for f in redraw(d, a.out):
            print(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
