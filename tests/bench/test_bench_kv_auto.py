"""What automatic exact matching (scheduling/exact_auto.py) costs a prefix-cache +
least-request decision. One run, one group, so the variants compare within it:

- `no-matcher`: kvEvents off (or no tokenizers): the default path before this change;
- `auto-no-streams`: the automatic matcher built (tokenizers given), no endpoint
  advertising a KV-event port: the case that must cost nothing;
- `auto-streams`: every endpoint advertises one (streams not up: every block falls back
  to the approximate match, the matcher tokenizes and matches anyway): the price of
  exact matching itself, for reference.

Each call is a whole Scheduler.candidates over 8 endpoints for a new request (a ~3 KB
chat prompt extending a cached system prompt: the tokenizer's prefix cache is warm, as
in steady traffic). Run with --benchmark-only (`make bench`)."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kthena_router.kv_events import EventSource
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.config import KvCacheAwareArgs, load_router_configuration_bytes
from kthena_router.scheduling.kv_matcher import KvAwareMatcher
from kthena_router.scheduling.request import RequestInfo
from kthena_router.scheduling.scheduler import Scheduler

TOKENIZER = Path(__file__).resolve().parents[2] / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
KEY = ("default", "demo")
SYSTEM = "You are a helpful assistant for the routing team; cite the house rules. " * 40
N = 8
BEST = b"""scheduler:
  plugins:
    Score:
      enabled:
      - {name: prefix-cache, weight: 1}
      - {name: least-request, weight: 1}
"""


def _endpoints() -> tuple[Any, ...]:
    from kthena_router.endpoints.health import EndpointHealth
    from kthena_router.endpoints.registry import EndpointState

    return tuple(EndpointState(f"127.0.0.1:{9000 + i}", "127.0.0.1", 9000 + i, "127.0.0.1", "http", None,
                               EndpointHealth(), {}, "default/demo") for i in range(N))


def _setup(variant: str) -> tuple[Scheduler, tuple[Any, ...], KvAwareMatcher | None]:
    cfg = load_router_configuration_bytes(BEST).scheduler
    metrics = RouterMetrics(CollectorRegistry())
    s = Scheduler(cfg, metrics)
    eps = _endpoints()
    s.sync({KEY: eps})
    matcher = None
    if variant != "no-matcher":
        args = KvCacheAwareArgs(tokenizers=MappingProxyType({"demo": str(TOKENIZER)}))
        matcher = KvAwareMatcher(args, metrics, auto=True)
        matcher.subscribers.set_sources = lambda sources: None  # type: ignore[method-assign]  # no ZMQ here
        s.set_kv_matcher(matcher)
        if variant == "auto-streams":
            matcher.set_endpoints({ep.key: (s.endpoint_id(ep.key), EventSource(f"tcp://{ep.host}:1"))
                                   for ep in eps})
        else:
            matcher.set_endpoints({})
    # half the endpoints hold the system prompt in the approximate index
    for i, ep in enumerate(eps[: N // 2]):
        info = _chat(f"warm{i}", "warm")
        s.candidates(KEY, eps, info)
        s.dispatched(ep, info)
        s.finished(ep)
    return s, eps, matcher


def _chat(rid: str, q: str) -> RequestInfo:
    body = {"model": "demo", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
    return RequestInfo(rid, "/v1/chat/completions", body, "demo", "", "demo")


@pytest.mark.benchmark(group="kv-auto-decision")
@pytest.mark.parametrize("variant", ["no-matcher", "auto-no-streams", "auto-streams"])
def test_bench_prefix_cache_decision(benchmark: Any, variant: str) -> None:
    s, eps, matcher = _setup(variant)
    ids = itertools.count()

    def one() -> None:
        n = next(ids)
        s.candidates(KEY, eps, _chat(f"r{n}", f"question {n % 64}"))

    one()  # the tokenizer's prefix cache warm, as in steady traffic
    benchmark(one)
    if matcher is not None:
        benchmark.extra_info["tokenized"] = matcher.tokenizers.get("demo") is not None
