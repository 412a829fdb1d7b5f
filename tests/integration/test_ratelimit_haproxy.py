"""Global token limits with three router replicas behind ONE address: a real haproxy (L4,
round-robin per connection) in front, Redis buckets shared by the replicas, streaming
OpenAI SDK clients that open a new connection per request (so consecutive requests of one
client land on different replicas). The budget holds within the tolerances that
test_ratelimit_global.py uses (three routers each addressed directly; ratelimit_support.py
explains them)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai

import harness
import haproxy_harness
import ratelimit_support as rs

CLIENTS = 9
QUIET_S = 3.0  # a client stops after being refused for this long (unused leases return within leaseIdle)


async def _client(base_url: str, model: str, max_tokens: int, stats: dict[str, int]) -> None:
    # `Connection: close`: every request is a new TCP connection, which haproxy gives to the next replica
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=60,
                                  default_headers={"Connection": "close"}) as client:
        refused_since: float | None = None
        while True:
            try:
                stream = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "tell me about rate limits " * 12}],
                    max_tokens=max_tokens, stream=True)
                async for _ in stream:
                    pass
                stats["ok"] += 1
                refused_since = None
                continue
            except openai.RateLimitError as exc:
                assert exc.response.headers["x-ratelimit-limit-tokens"], exc.response.headers
                stats["refused"] += 1
            now = time.monotonic()
            refused_since = refused_since or now
            if now - refused_since >= QUIET_S:
                return
            await asyncio.sleep(0.1)


def _run(url: str, model: str, max_tokens: int) -> dict[str, int]:
    stats = {"ok": 0, "refused": 0}

    async def main() -> None:
        await asyncio.gather(*(_client(url, model, max_tokens, stats) for _ in range(CLIENTS)))

    asyncio.run(main())
    return stats


def _admitted(router: harness.Router, route: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()),
                                "kthena_router_ratelimit_decisions_total", model_route=route, result="admitted")


def test_three_replicas_behind_haproxy_hold_one_global_budget(tmp_path: Path) -> None:
    with rs.budget_env(tmp_path) as env:
        hap = haproxy_harness.start_haproxy(tmp_path, [r.port for r in env.routers])
        try:
            def run(model: str, max_tokens: int) -> dict[str, int]:
                return _run(hap.openai_url, model, max_tokens)

            stats = rs.check_input_budget(env, run)
            # the balancer spread the admitted requests over every replica (round-robin per connection)
            per_replica = [_admitted(r, "default/demo") for r in env.routers]
            print(f"admitted per replica {per_replica}")
            assert min(per_replica) >= stats["ok"] / 6, per_replica
            rs.check_output_budget(env, run, clients=CLIENTS)
        finally:
            hap.stop()
