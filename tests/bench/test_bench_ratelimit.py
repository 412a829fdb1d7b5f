"""The limiter's added cost per request (local buckets): plan lookup, admission, the
streamed-output charge of one read, settlement. Run with --benchmark-only; figures in
docs/ratelimit.md."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from config_fixtures import endpoints, load, route, server  # noqa: E402

from kthena_router.identity.model import ANONYMOUS, Identity  # noqa: E402
from kthena_router.ratelimit.limiter import Limiter  # noqa: E402
from kthena_router.ratelimit.metrics import RateLimitMetrics  # noqa: E402
from kthena_router.scheduling.config import load_router_configuration_bytes  # noqa: E402

BIG = 10**12  # never refuses during the benchmark
SECTION = f"""
rateLimits:
  perTenant: {{inputTokensPerUnit: {BIG}, outputTokensPerUnit: {BIG}, unit: hour}}
  perUser: {{requestsPerUnit: {BIG}, unit: hour}}
""".encode()
X = SimpleNamespace(att_prompt_tokens=120, completion_tokens=16, status=200, model_label="demo",
                    path_label="/v1/chat/completions")
BODY = SimpleNamespace(raw=b"x" * 480, obj={"messages": []}, model="demo")
EVENTS = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def _setup(tmp_path: Path, kthena: bool, section: bytes) -> tuple[Limiter, object]:
    r = route()
    if kthena:
        r["spec"]["rateLimit"] = {"inputTokensPerUnit": 2**32 - 1, "outputTokensPerUnit": 2**32 - 1, "unit": "hour"}
    rt = load(tmp_path, [r, server(), endpoints()]).routes[0]
    rc = load_router_configuration_bytes(section)
    return Limiter(RateLimitMetrics(CollectorRegistry()), lambda: rc.rate_limits), rt


@pytest.mark.parametrize("case", ["off", "kthena", "tenant+user"])
def test_bench_limiter_request(benchmark, tmp_path: Path, case: str) -> None:
    lim, rt = _setup(tmp_path, case == "kthena", SECTION if case == "tenant+user" else b"{}")
    ident = Identity("acme", "alice", "", "api_key", "k") if case == "tenant+user" else ANONYMOUS
    loop = asyncio.new_event_loop()

    async def one() -> None:
        plan = lim.plan(rt, ident)
        if plan is None:
            return
        t = await plan.admit(X, BODY, ident)
        t.streamed(EVENTS)
        t.settle(X)

    def run() -> None:
        coro = one()
        try:  # drive the coroutine without the loop: no await suspends with local buckets
            coro.send(None)
        except StopIteration:
            pass

    loop.run_until_complete(one())  # creates the buckets
    benchmark(run)
    loop.close()
