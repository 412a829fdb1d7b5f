"""Global token limits with three router replicas behind ONE address: a real haproxy (L4,
round-robin per connection) in front, Redis buckets shared by the replicas, streaming
OpenAI SDK clients that open a new connection per request (so consecutive requests of one
client land on different replicas). The budget holds within the tolerances that
test_ratelimit_global.py uses and explains (three routers each addressed directly)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

import harness
import haproxy_harness
import redis_harness

CLIENTS = 9
LEASE_PERCENT = 1
QUIET_S = 3.0  # a client stops after being refused for this long (unused leases return within leaseIdle)


def _engine_tokens(sim: harness.Simulator) -> tuple[float, float]:
    prompt = gen = 0.0
    for url in sim.urls:
        fams = harness.parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        prompt += harness.metric_value(fams, "vllm:prompt_tokens_total")
        gen += harness.metric_value(fams, "vllm:generation_tokens_total")
    return prompt, gen


def _config(sim: harness.Simulator, redis: redis_harness.RedisServer, limits: dict[str, dict[str, Any]]) -> list:
    labels = {"app": "demo"}
    docs: list[dict[str, Any]] = []
    for name, limit in limits.items():
        route = harness.route_doc(name, name, "demo")
        route["spec"]["rateLimit"] = {**limit, "global": {"redis": {"address": redis.address}}}
        docs.append(route)
    return docs + [harness.server_doc("demo", "demo", labels), harness.endpoints_doc("demo-engines", sim.ports, labels)]


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
    redis = redis_harness.start_redis(tmp_path)
    sim = harness.start_simulator(tmp_path, engines=3, fast=True)
    inp, out = 30000, 3000
    limits = {"demo": {"inputTokensPerUnit": inp, "unit": "hour"},
              "demo-out": {"outputTokensPerUnit": out, "unit": "hour"}}
    config = harness.write_config(tmp_path / "cfg.yaml", _config(sim, redis, limits))
    rc = tmp_path / "router.yaml"
    rc.write_text(yaml.safe_dump({"rateLimits": {"leasePercent": LEASE_PERCENT, "leaseIdle": "1s"}}))
    routers = [harness.start_router(config, tmp_path / f"r{i}", extra_args=["--router-config", str(rc)], wait=False)
               for i in range(3)]
    hap = None
    try:
        for r in routers:
            r.wait_ready()
        hap = haproxy_harness.start_haproxy(tmp_path, [r.port for r in routers])

        t0 = time.monotonic()
        stats = _run(hap.openai_url, "demo", 4)
        prompt, _ = _engine_tokens(sim)
        refill = inp / 3600 * (time.monotonic() - t0)
        per_replica = [_admitted(r, "default/demo") for r in routers]
        print(f"input: admitted {prompt:.0f} of {inp} (+{refill:.0f} refilled), {stats}, per replica {per_replica}")
        assert stats["refused"] > 0 and stats["ok"] > 100, stats
        # the balancer spread the admitted requests over every replica (round-robin per connection)
        assert min(per_replica) >= stats["ok"] / 6, per_replica
        # as test_ratelimit_global: 98-100% of the budget, plus what refilled, plus at most one
        # lease per replica
        assert 0.98 * inp <= prompt <= inp + refill + 3 * inp * LEASE_PERCENT / 100, (prompt, refill, stats)

        before = _engine_tokens(sim)[1]
        t0 = time.monotonic()
        max_tokens = 40
        stats = _run(hap.openai_url, "demo-out", max_tokens)
        gen = _engine_tokens(sim)[1] - before
        refill = out / 3600 * (time.monotonic() - t0)
        # as test_ratelimit_global: an admission reserves its max_tokens of what is there, so
        # the overshoot is bounded by the in-flight requests' max_tokens (plus refills)
        in_flight = CLIENTS * max_tokens
        print(f"output: {gen:.0f} of {out} (+{refill:.0f} refilled, in-flight bound {in_flight}), {stats}")
        assert stats["refused"] > 0, stats
        assert 0.98 * out <= gen <= out + refill + in_flight, (gen, refill, stats)
        charged = sum(harness.metric_value(harness.parse_metrics(r.metrics_text()),
                                           "kthena_router_ratelimit_charged_tokens_total", token_type="output")
                      for r in routers)
        assert charged == _engine_tokens(sim)[1]
    finally:
        if hap is not None:
            hap.stop()
        for r in routers:
            r.stop()
        sim.stop()
        redis.stop()
