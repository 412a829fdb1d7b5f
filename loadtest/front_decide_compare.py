"""Before/after figures of loadtest/front_decide_cost.py: the same harness run alternately
against two source trees (fresh processes, interleaved rounds), medians per case.

    python -m loadtest.front_decide_compare --base /tmp/base-tree [--rounds 5] [--n 5000]

`--base` is a checkout of the earlier code with the built extension (kthena_router/_core*.so)
in it; this tree's harness file is copied into it (loadtest/front_decide_cost.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
_RUN = ("import asyncio, json, sys; from loadtest.front_decide_cost import measure; "
        "r = asyncio.run(measure(int(sys.argv[1]), 1)); print(json.dumps({k: v[0] for k, v in r.items()}))")
HARNESS = "loadtest/front_decide_cost.py"


def _run(tree: Path, n: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _RUN, str(n)], env=env, cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=5000)
    args = ap.parse_args()
    trees = {"before": args.base.resolve(), "after": HERE}
    if trees["before"] != HERE:
        shutil.copyfile(HERE / HARNESS, trees["before"] / HARNESS)
    res: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            for case, us in _run(tree, args.n).items():
                res[name].setdefault(case, []).append(us)
    print(f"{'case':14s} {'before':>8s} {'after':>8s}  ratio   (µs/request, median of {args.rounds} rounds)")
    for case in res["before"]:
        b, a = statistics.median(res["before"][case]), statistics.median(res["after"][case])
        print(f"{case:14s} {b:8.1f} {a:8.1f}  {a / b:5.2f}   before {min(res['before'][case]):.1f}.."
              f"{max(res['before'][case]):.1f}, after {min(res['after'][case]):.1f}..{max(res['after'][case]):.1f}")


if __name__ == "__main__":
    main()
