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
import shlex
import tempfile
import time
from collections.abc import Callable
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
KINDS = ("health", "metrics")  # the simulator's poll counters: probes, scrapes
Polls = list[dict[str, int]]  # an engine's poll counters, per engine


def poller_args(logdir: Path, interval: float) -> list[str]:
    """Router arguments for a poll count (also tests/integration/test_pod_state_hub.py):
    ROUTER_CONFIG (written to `logdir`), scrape and probe period `interval` seconds."""
    rc = logdir / "router-configuration.yaml"
    rc.write_text(ROUTER_CONFIG)
    return ["--router-config", str(rc), "--scrape-interval-s", str(interval),
            "--health-probe-interval-s", str(interval)]


def count_polls(read: Callable[[], Polls], window: float) -> tuple[Polls, float]:
    """The probes and scrapes each engine served during `window` seconds (`read` returns
    the engines' counters), and the window measured."""
    before, t0 = read(), time.monotonic()
    time.sleep(window)
    after, dt = read(), time.monotonic() - t0
    return [{k: a[k] - b[k] for k in KINDS} for a, b in zip(after, before)], dt


def polls(admin: int) -> Polls:
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
        start_router(f"router-w{workers}-{mode}", "demo", workers,
                     shlex.join([*poller_args(logdir, interval), "--pod-state", mode]), logdir, ports, procs, 90)
        time.sleep(2 * interval)  # past the start-up probes
        counts, dt = count_polls(lambda: polls(admin), window)
        return {k: sum(c[k] for c in counts) / ENGINES / dt for k in KINDS}
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
