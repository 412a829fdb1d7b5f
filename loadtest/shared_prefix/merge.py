"""Merge several runner outputs (results.json) into one table, e.g. a table built in pieces
on a shared machine (one run per policy group or KV factor):

    python -m loadtest.shared_prefix.merge --out results/all results/a results/b ...

Rows are (KV factor, policy); their cells (seeds) are pooled, a later input's cell replacing
an earlier one's of the same seed, and the aggregate recomputed. Inputs must
share profile, workload and time scale (else the figures are not comparable: refused).
Writes results.json, results.md and the plots as the runner does (TTFT plots from the
cells' `ttft_samples_s`; cells from runs older than that field are left out of the plots).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import policies, report

_SAME = ("profile", "workload", "time_scale", "engines", "block_size", "model")


def _add_row(rows: dict[str, Any], name: str, row: dict[str, Any]) -> None:
    old = rows.get(name)
    if old is None or old.get("skipped"):
        rows[name] = row
        return
    if row.get("skipped"):  # a measured row beats a skip
        return
    cells = {c["seed"]: c for c in old["cells"]}
    cells.update({c["seed"]: c for c in row["cells"]})
    pooled = [cells[k] for k in sorted(cells)]
    good = [c for c in pooled if c["accepted"]]
    rows[name] = {"seeds_run": len(pooled), "seeds_ok": len(good),
                  "aggregate": report.aggregate(good), "cells": pooled}


def merge(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    if not summaries:
        raise ValueError("nothing to merge")
    base = summaries[0]
    for s in summaries[1:]:
        diff = [k for k in _SAME if s.get(k) != base.get(k)]
        if diff:
            raise ValueError(f"inputs differ in {', '.join(diff)}: not comparable")
    out: dict[str, Any] = {k: base[k] for k in base if k != "tables"}
    out["seeds"] = sorted({x for s in summaries for x in s["seeds"]})
    tables: dict[float, dict[str, Any]] = {}
    for s in summaries:
        for block in s["tables"]:
            t = tables.setdefault(block["kv_factor"], {"kv_factor": block["kv_factor"],
                                                       "kv_blocks": block["kv_blocks"], "rows": {}})
            for name, row in block["rows"].items():
                _add_row(t["rows"], name, row)
    order = {n: i for i, n in enumerate(policies.DEFAULT_POLICIES)}
    for t in tables.values():  # the table order, others after
        t["rows"] = dict(sorted(t["rows"].items(), key=lambda kv: order.get(kv[0], len(order))))
    out["tables"] = [tables[k] for k in sorted(tables)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.shared_prefix.merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("inputs", type=Path, nargs="+", help="runner --out directories")
    a = p.parse_args(argv)
    try:
        summary = merge([json.loads((d / "results.json").read_text()) for d in a.inputs])
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    report.write_json(a.out / "results.json", summary)
    md = report.markdown(summary)
    (a.out / "results.md").write_text(md)
    for block in summary["tables"]:
        ttfts = {name: [x for c in row.get("cells", []) if c["accepted"]
                        for x in c.get("ttft_samples_s", [])]
                 for name, row in block["rows"].items() if not row.get("skipped")}
        ttfts = {k: v for k, v in ttfts.items() if v}
        if ttfts:
            report.plot_ttft(a.out / f"ttft_kv{block['kv_factor']:g}.png", ttfts,
                             f"TTFT, profile {summary['profile']}, KV x{block['kv_factor']:g}")
    if len(summary["tables"]) > 1:
        report.plot_sweep(a.out / "sweep.png", summary)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
