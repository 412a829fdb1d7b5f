"""Probes and scrapes per engine against the router's worker count (docs/pod-state.md).

    python -m loadtest.pod_state_polls --workers 1,2,3 --window 10

For each worker count and --pod-state mode (auto: the hub; off: every worker on its own)
it starts the simulator (3 engines) and our router with a routerConfiguration, waits until
the router is ready, then counts the GET /health and GET /metrics each engine served
during `window` seconds (the simulator's own counters, admin /state "polls").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from loadtest.procs import Proc, http, start_router, start_simulator

ROUTER_CONFIG = """\
scheduler:
  plugins:
    Score:
      enabled:
      - {name: prefix-cache, weight: 1}
      - {name: least-request, weight: 1}
"""
ENGINES = 3


def polls(admin: int) -> list[dict[str, int]]:
    out = []
    for i in range(ENGINES):
        status, body = http("GET", f"http://127.0.0.1:{admin}/admin/engines/{i}/state")
        assert status == 200, body
        out.append(json.loads(body)["polls"])
    return out


def measure(workers: int, mode: str, window: float, interval: float, logdir: Path) -> dict[str, float]:
    procs: list[Proc] = []
    try:
        _, ports, admin = start_simulator(ENGINES, "demo", "", logdir, procs, 60)
        rc = logdir / "router-configuration.yaml"
        rc.write_text(ROUTER_CONFIG)
        start_router(f"router-w{workers}-{mode}", "demo", workers,
                     f"--router-config {rc} --pod-state {mode} --scrape-interval-s {interval} "
                     f"--health-probe-interval-s {interval}", logdir, ports, procs, 90)
        time.sleep(2 * interval)  # past the start-up probes
        before, t0 = polls(admin), time.monotonic()
        time.sleep(window)
        after, dt = polls(admin), time.monotonic() - t0
        per = {k: sum(a[k] - b[k] for a, b in zip(after, before)) / ENGINES / dt for k in ("health", "metrics")}
        return per
    finally:
        for p in reversed(procs):
            p.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.pod_state_polls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2,3")
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=0.5, help="scrape and probe period (s)")
    a = p.parse_args()
    print(f"| workers | --pod-state | /health per engine per s | /metrics per engine per s |"
          f" (period {a.interval:g} s: one poller = {1 / a.interval:g}/s)")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="pod-state-polls-") as tmp:
        for w in (int(x) for x in a.workers.split(",")):
            for mode in (("auto", "off") if w > 1 else ("auto",)):
                d = Path(tmp) / f"w{w}-{mode}"
                d.mkdir()
                r = measure(w, mode, a.window, a.interval, d)
                print(f"| {w} | {mode} | {r['health']:.2f} | {r['metrics']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
