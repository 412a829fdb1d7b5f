"""What automatic exact matching (kvEvents.exactMatching: auto, docs/kv-exact-default.md)
costs a prefix-cache + least-request decision, in process: a whole Scheduler.candidates
over 8 endpoints for a new request (a ~3 KB chat prompt extending a cached system prompt).

Variants: `no-matcher` (exactMatching off, or no tokenizers: the path before the change),
`auto-no-streams` (the matcher built, no endpoint advertising a KV-event port: must cost
nothing), `auto-streams` (every endpoint advertises one, streams not up: the matcher
tokenizes and matches, i.e. kvcache-aware's own price). The first two are timed in
alternating blocks (drift and foreign load hit both alike) and compared block by block.

    python -m loadtest.kv_auto_overhead [--blocks 40] [--calls 2000]

tests/bench/test_bench_kv_auto.py runs the same setups under pytest-benchmark.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry

from kthena_router.endpoints.health import EndpointHealth
from kthena_router.endpoints.registry import EndpointState
from kthena_router.kv_events import EventSource
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.config import KvCacheAwareArgs, load_router_configuration_bytes
from kthena_router.scheduling.kv_matcher import KvAwareMatcher
from kthena_router.scheduling.request import RequestInfo
from kthena_router.scheduling.scheduler import Scheduler

TOKENIZER = Path(__file__).resolve().parent / "simulator" / "tokenizer" / "tokenizer.json"
KEY = ("default", "demo")
SYSTEM = "You are a helpful assistant for the routing team; cite the house rules. " * 40
N = 8
VARIANTS = ("no-matcher", "auto-no-streams", "auto-streams")
BEST = b"""scheduler:
  plugins:
    Score:
      enabled:
      - {name: prefix-cache, weight: 1}
      - {name: least-request, weight: 1}
"""


def chat(rid: str, q: str) -> RequestInfo:
    body = {"model": "demo", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
    return RequestInfo(rid, "/v1/chat/completions", body, "demo", "", "demo")


def setup(variant: str) -> tuple[Scheduler, tuple[EndpointState, ...], KvAwareMatcher | None]:
    """A scheduler of the variant, half its endpoints holding the system prompt."""
    metrics = RouterMetrics(CollectorRegistry())
    s = Scheduler(load_router_configuration_bytes(BEST).scheduler, metrics)
    eps = tuple(EndpointState(f"127.0.0.1:{9000 + i}", "127.0.0.1", 9000 + i, "127.0.0.1", "http", None,
                              EndpointHealth(), {}, "default/demo") for i in range(N))
    s.sync({KEY: eps})
    matcher = None
    if variant != "no-matcher":
        args = KvCacheAwareArgs(tokenizers=MappingProxyType({"demo": str(TOKENIZER)}))
        matcher = KvAwareMatcher(args, metrics, auto=True)
        matcher.subscribers.set_sources = lambda sources: None  # type: ignore[method-assign]  # no ZMQ here
        s.set_kv_matcher(matcher)
        sources = {ep.key: (s.endpoint_id(ep.key), EventSource(f"tcp://{ep.host}:1")) for ep in eps}
        matcher.set_endpoints(sources if variant == "auto-streams" else {})  # type: ignore[arg-type]
    for i, ep in enumerate(eps[: N // 2]):
        info = chat(f"warm{i}", "warm")
        s.candidates(KEY, eps, info)
        s.dispatched(ep, info)
        s.finished(ep)
    return s, eps, matcher


def decider(variant: str) -> Any:
    """A function making one decision for a new request (tokenizer cache warmed)."""
    s, eps, _ = setup(variant)
    ids = itertools.count()

    def one() -> None:
        n = next(ids)
        s.candidates(KEY, eps, chat(f"r{n}", f"question {n % 64}"))

    one()
    return one


def _block(fn: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    base, auto, streams = (decider(v) for v in VARIANTS)
    load = os.getloadavg()[0]
    ratios, b_us, a_us = [], [], []
    for i in range(a.blocks):
        first, second = (base, auto) if i % 2 == 0 else (auto, base)
        t1, t2 = _block(first, a.calls), _block(second, a.calls)
        tb, ta = (t1, t2) if first is base else (t2, t1)
        b_us.append(tb)
        a_us.append(ta)
        ratios.append(ta / tb)
    s_us = [_block(streams, a.calls // 10) for _ in range(5)]
    q = statistics.quantiles(ratios, n=4)
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}; {a.blocks} alternating blocks of {a.calls} decisions")
    print(f"no-matcher      median {statistics.median(b_us):7.2f} us/decision")
    print(f"auto-no-streams median {statistics.median(a_us):7.2f} us/decision")
    print(f"ratio auto-no-streams / no-matcher per block: median {statistics.median(ratios):.4f} "
          f"(quartiles {q[0]:.4f} .. {q[2]:.4f})")
    print(f"auto-streams    median {statistics.median(s_us):7.2f} us/decision (kvcache-aware's own price)")


if __name__ == "__main__":
    main()
