"""Throughput at equal TTFT for the hard workloads: a rate sweep's goodput table.

Below capacity every router that keeps its hits serves the offered load with nearly the
same TTFT, so one rate cannot rank them. Run a profile at several rates
(`runner.py --profile zipf --set rate=R --out DIR_R`, one directory per rate), then

    python -m loadtest.shared_prefix.hard_goodput DIR... --slo-p90 0.25 [--markdown F]

prints, per policy, each rate's served req/s, p90 TTFT and hit rate, and the goodput:
the highest offered rate up to which every accepted seed kept p90 TTFT within the SLO
(the SLO is the reader's choice, stated with the table; rejected cells do not count).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RATE_FIELDS = ("rate", "session_rate", "capacity")  # the profile's load knob


def offered_rate(summary: dict[str, Any]) -> float:
    w = summary["workload"]
    for f in RATE_FIELDS:
        if f in w:
            return float(w[f])
    raise ValueError(f"no rate field in workload {w.get('kind')}")


def collect(summaries: list[dict[str, Any]]) -> dict[str, dict[float, list[dict[str, Any]]]]:
    """policy -> offered rate -> the accepted cells' metrics (plus the seed)."""
    out: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for s in summaries:
        rate = offered_rate(s)
        for block in s["tables"]:
            for name, row in block["rows"].items():
                cells = out.setdefault(name, {}).setdefault(rate, [])
                cells.extend({**c["metrics"], "seed": c["seed"]} for c in row.get("cells", [])
                             if c["accepted"])
    return out


def goodput(by_rate: dict[float, list[dict[str, Any]]], slo_p90_s: float) -> float | None:
    """The highest offered rate up to which every measured rate's accepted cells kept p90
    TTFT <= the SLO (a miss at a lower rate ends it); a rate with no accepted cell does
    not count either way."""
    best = None
    for r in sorted(by_rate):
        cells = by_rate[r]
        if not cells:
            continue
        if not all(c["ttft_p90_s"] is not None and c["ttft_p90_s"] <= slo_p90_s for c in cells):
            break
        best = r
    return best


def markdown(summaries: list[dict[str, Any]], slo_p90_s: float) -> str:
    data = collect(summaries)
    rates = sorted({r for by_rate in data.values() for r in by_rate})
    head = ["policy", *(f"{r:g}/s: served, p90, hits" for r in rates),
            f"goodput (p90 <= {slo_p90_s:g} s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, by_rate in data.items():
        row = [name]
        for r in rates:
            cells = by_rate.get(r, [])
            row.append(" ; ".join(f"{c['req_s']:.1f}, {c['ttft_p90_s']:.3g} s, "
                                  f"{100 * (c['hit_rate'] or 0):.1f}%" for c in cells) or "-")
        g = goodput(by_rate, slo_p90_s)
        row.append("-" if g is None else f"{g:g}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.shared_prefix.hard_goodput",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="runner --out directories")
    p.add_argument("--slo-p90", type=float, required=True, help="simulated seconds")
    p.add_argument("--markdown", type=Path, default=None)
    a = p.parse_args(argv)
    summaries = [json.loads((d / "results.json").read_text()) for d in a.dirs]
    text = markdown(summaries, a.slo_p90)
    if a.markdown:
        a.markdown.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
