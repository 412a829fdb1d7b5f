"""CPU of the Python half of a Rust-front fast-path request, in process (docs/rust-front.md,
"Python per request").

Builds a real worker (create_app + its lifespan: config file, state, balancer, prometheus
multiprocess files) and drives `FastPath` the way `bridge.RustFront._on_wake` does, one
wake-up per request: decide, (first_byte for a stream), done, flush. The Rust `_core.Front`
is replaced by `FakeCore`, which records what Python hands it: that is the boundary, the
rest is the router's own code.

    python -m loadtest.front_decide_cost [--n 20000] [--repeats 5] [--profile CASE]

Cases: {plain,stream} x {rr (no router configuration), prefix (configs/scheduling/prefix-cache.yaml)}.
Prints µs per request (median of the repeats, interleaved across cases).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import inspect
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.loadgen import chat_body
from loadtest.procs import router_config

MODEL = "demo"
ENGINE_PORTS = [18001, 18002]
PREFIX_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "scheduling" / "prefix-cache.yaml"
# what an OpenAI SDK client sends (the Rust front passes every header, lower-case)
HEADERS = [("host", "127.0.0.1:8080"), ("accept-encoding", "gzip, deflate"), ("connection", "keep-alive"),
           ("accept", "application/json"), ("content-type", "application/json"),
           ("user-agent", "OpenAI/Python 1.54.0"), ("x-stainless-lang", "python"),
           ("x-stainless-package-version", "1.54.0"), ("x-stainless-os", "Linux"), ("x-stainless-arch", "x64"),
           ("x-stainless-runtime", "CPython"), ("x-stainless-runtime-version", "3.12.3"),
           ("authorization", "Bearer sk-none"), ("x-stainless-retry-count", "0"), ("content-length", "97")]
CASES = ("plain-rr", "stream-rr", "plain-prefix", "stream-prefix")


class FakeCore:
    """Stands in for `_core.Front`: records the decisions Python answers."""

    def __init__(self) -> None:
        self.fast_calls: list[tuple[Any, ...]] = []
        self.slow_calls: list[int] = []
        self.keep = True  # False: count only (the hot loop)
        self.n_fast = 0

    def fast(self, *args: Any) -> bool:
        self.n_fast += 1
        if self.keep:
            self.fast_calls.append(args)
        return True

    def slow(self, rid: int) -> None:
        self.slow_calls.append(rid)


@dataclass
class Worker:
    fast: Any  # FastPath
    core: FakeCore
    app: Any
    tmp: Path
    rid: int = 0
    last_stream: bool = False
    wake_scoped: bool = False  # the bridge marks the batch scheduled for a wake-up (its flush ends it)
    bodies: dict[bool, bytes] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def worker(prefix: bool, tmp_root: Path | None = None, watch: bool = False) -> AsyncIterator[Worker]:
    """A started worker (lifespan running) with a FastPath on a FakeCore; `watch`: the config
    file is watched (tests reload it)."""
    from kthena_router.app import create_app
    from kthena_router.front.decide import FastPath
    from kthena_router.settings import RouterSettings

    tmp = Path(tempfile.mkdtemp(prefix="decide-cost-", dir=tmp_root))
    cfg = tmp / "config.yaml"
    cfg.write_text(router_config(MODEL, ENGINE_PORTS))
    rc = ""
    if prefix:
        rc = str(tmp / "router.yaml")
        shutil.copy(PREFIX_CONFIG, rc)
    (tmp / "rt").mkdir()
    settings = RouterSettings(config_path=str(cfg), router_config_path=rc, interface="rsgi", watch_config=watch,
                              runtime_dir=str(tmp / "rt"), health_probe_interval_s=3600.0, scrape_interval_s=3600.0,
                              route_seed=1)
    app = create_app(settings)
    try:
        async with app.starlette.router.lifespan_context(app.starlette):
            core = FakeCore()
            fast = FastPath(app.forwarder, core)
            w = Worker(fast, core, app, tmp, bodies={s: chat_body(MODEL, stream=s) for s in (False, True)},
                       wake_scoped=_wake_scoped())
            try:
                yield w
            finally:
                fast.abandon_all()  # the last request's end: nothing in flight, no drain wait at shutdown
                fast.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _wake_scoped() -> bool:
    """Whether this tree's bridge marks the batch scheduled while it handles a wake-up (the
    harness runs older trees too, for before/after figures)."""
    from kthena_router.front.bridge import RustFront

    return "batch.scheduled = True" in inspect.getsource(RustFront._on_wake)


async def one(w: Worker, stream: bool) -> None:
    """One fast-path request as Rust reports it (1 attempt, 200), in the wake-ups of a closed
    loop: the decision's (with the previous request's end riding along, as at c=1 when the
    client sends its next request at once), then for a stream its first byte's (the 1.5 ms
    report timer's)."""
    w.rid += 1
    rid = w.rid
    fast = w.fast
    fast.batch.scheduled = w.wake_scoped  # as bridge.RustFront._on_wake (its flush ends the wake-up)
    fast.decide(rid, "/v1/chat/completions", b"", HEADERS, w.bodies[stream])
    if fast.tasks:  # the scheduler's prepare() as a task
        await asyncio.gather(*fast.tasks)
    if rid > 1:
        _done(fast, rid - 1, w.last_stream)
    fast.flush()
    if stream:
        fast.batch.scheduled = w.wake_scoped
        fast.first_byte(rid, [(0, 0)])
        fast.flush()
    await asyncio.sleep(0)  # a loop iteration: what the batch scheduled with call_soon runs
    w.last_stream = stream


def _done(fast: Any, rid: int, stream: bool) -> None:
    fast.done(rid, 200, 0, [(0, 0)], 0.02, 0.005 if stream else -1.0, 0.005 if stream else -1.0,
              0.001 if stream else -1.0, 12, 16, 18 if stream else 0)


async def run(w: Worker, stream: bool, n: int) -> float:
    """µs per request over n requests (after a warm-up)."""
    w.core.keep = False
    for _ in range(200):
        await one(w, stream)
    t0 = time.process_time()
    for _ in range(n):
        await one(w, stream)
    return (time.process_time() - t0) / n * 1e6


def _case(name: str) -> tuple[bool, bool]:
    mode, bal = name.split("-")
    return mode == "stream", bal == "prefix"


async def measure(n: int, repeats: int, cases: tuple[str, ...] = CASES) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {c: [] for c in cases}
    async with contextlib.AsyncExitStack() as stack:
        workers = {p: await stack.enter_async_context(worker(p)) for p in {_case(c)[1] for c in cases}}
        for _ in range(repeats):
            for c in cases:
                stream, prefix = _case(c)
                out[c].append(await run(workers[prefix], stream, n))
        for w in workers.values():
            assert not w.core.slow_calls, f"slow path taken: {len(w.core.slow_calls)}"
    return out


async def profile(case: str, n: int, out: Callable[[str], None] = print) -> None:
    stream, prefix = _case(case)
    async with worker(prefix) as w:
        await run(w, stream, 200)
        prof = cProfile.Profile()
        prof.enable()
        await run(w, stream, n)
        prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", choices=CASES)
    args = ap.parse_args()
    if args.profile:
        asyncio.run(profile(args.profile, args.n))
        return
    res = asyncio.run(measure(args.n, args.repeats))
    for c, vals in res.items():
        print(f"{c:14s} {statistics.median(vals):7.1f} us/req  (min {min(vals):.1f}, max {max(vals):.1f})")


if __name__ == "__main__":
    main()
