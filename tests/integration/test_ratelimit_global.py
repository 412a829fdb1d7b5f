"""Global token rate limits in a real Redis: three routers share one per-hour budget under
concurrent streaming clients; Redis killed mid-run: fail-open and fail-closed routes behave
as documented, and the routers recover when it returns."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis as redis_lib
import yaml

import auth_harness as ah
import harness
import ratelimit_support as rs
import redis_harness

CLIENTS_PER_ROUTER = 3


async def _client(base: str, model: str, max_tokens: int, quiet_s: float, stats: dict[str, int]) -> None:
    """Streams until every attempt has been refused for `quiet_s` (leases unused by the
    other routers go back to Redis within leaseIdle, so the last of the budget is used)."""
    refused_since: float | None = None
    body = {"model": model, "messages": [{"role": "user", "content": "tell me about rate limits " * 12}],
            "max_tokens": max_tokens, "stream": True}
    async with httpx.AsyncClient(timeout=60) as http:
        while True:
            async with http.stream("POST", f"{base}/chat/completions", json=body) as r:
                if r.status_code == 200:
                    async for _ in r.aiter_bytes():
                        pass
                    stats["ok"] += 1
                    refused_since = None
                    continue
                assert r.status_code == 429, (r.status_code, await r.aread())
                assert r.headers["x-ratelimit-limit-tokens"] and int(r.headers["retry-after"]) >= 1
                stats["refused"] += 1
            now = time.monotonic()
            refused_since = refused_since or now
            if now - refused_since >= quiet_s:
                return
            await asyncio.sleep(0.1)


def _run_clients(routers: list[harness.Router], model: str, max_tokens: int) -> dict[str, int]:
    stats = {"ok": 0, "refused": 0}

    async def main() -> None:
        await asyncio.gather(*(_client(r.openai_url, model, max_tokens, 3.0, stats)
                               for r in routers for _ in range(CLIENTS_PER_ROUTER)))

    asyncio.run(main())
    return stats


def test_three_routers_share_one_global_hourly_budget(tmp_path: Path) -> None:
    with rs.budget_env(tmp_path) as env:
        def run(model: str, max_tokens: int) -> dict[str, int]:
            return _run_clients(env.routers, model, max_tokens)

        rs.check_input_budget(env, run)
        rs.check_output_budget(env, run, clients=len(env.routers) * CLIENTS_PER_ROUTER)


def test_redis_outage_fail_open_and_fail_closed_then_recovery(tmp_path: Path) -> None:
    redis = redis_harness.start_redis(tmp_path)
    sim = harness.start_simulator(tmp_path, engines=1, fast=True)
    big = {"inputTokensPerUnit": 10**7, "unit": "hour"}
    docs = rs.global_limit_config(sim, redis, {"open": big, "closed": big})
    config = harness.write_config(tmp_path / "cfg.yaml", docs)
    rc = tmp_path / "router.yaml"
    rc.write_text(yaml.safe_dump({"rateLimits": {
        "leasePercent": 0,  # a round trip per request: the outage shows at once
        "redisRetry": "300ms", "redisTimeout": "200ms",
        "routes": {"open": {"failMode": "open"}, "closed": {"failMode": "closed"}}}}))
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)])

    def chat(model: str) -> httpx.Response:
        return http.post(f"{router.openai_url}/chat/completions",
                         json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})

    try:
        with httpx.Client(timeout=30) as http:
            assert chat("open").status_code == 200 and chat("closed").status_code == 200
            redis.kill()
            for _ in range(5):
                assert chat("open").status_code == 200
                r = chat("closed")
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "ratelimit_unavailable" and r.headers["retry-after"] == "1"
            fams = harness.parse_metrics(router.metrics_text())
            assert harness.metric_value(fams, "kthena_router_ratelimit_redis_errors_total") >= 1
            assert harness.metric_value(fams, "kthena_router_ratelimit_decisions_total", model_route="default/open",
                                        result="failed_open") == 5
            assert harness.metric_value(fams, "kthena_router_ratelimit_decisions_total",
                                        model_route="default/closed", result="failed_closed") == 5
            redis.start()  # same port, empty
            harness.wait_until(lambda: chat("closed").status_code == 200, 30, interval=0.2,
                               what="fail-closed route admitted again after Redis returned")
            assert chat("open").status_code == 200
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, "kthena_router_ratelimit_decisions_total", model_route="default/closed",
                                    result="admitted") >= 2
    finally:
        router.stop()
        sim.stop()
        redis.stop()


def test_refusal_costs_no_session_lookup_and_a_client_leaving_during_a_redis_wait_cancels(tmp_path: Path) -> None:
    """Rate-limit admission runs before the session-store lookup, and both Redis waits are
    watched for the client leaving."""
    redis = redis_harness.start_redis(tmp_path)
    sim = harness.start_simulator(tmp_path, engines=1, fast=True)
    docs = rs.global_limit_config(sim, redis, {"tiny": {"inputTokensPerUnit": 5, "unit": "hour"},
                                "wide": {"inputTokensPerUnit": 10**7, "unit": "hour"}})
    for doc in docs:
        if doc["kind"] == "ModelRoute":
            doc["spec"]["sessionSticky"] = {"sources": [{"type": "Header", "name": "X-Session-ID"}]}
    config = harness.write_config(tmp_path / "cfg.yaml", docs)
    rc = tmp_path / "router.yaml"
    rc.write_text(yaml.safe_dump({
        "sessionSticky": {"backend": "redis", "redis": {"address": redis.address}},
        "rateLimits": {"leasePercent": 0, "redisTimeout": "120s", "routes": {"wide": {"failMode": "closed"}}}}))
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)])
    db = redis_lib.Redis(host=harness.HOST, port=redis.port)
    body = {"messages": [{"role": "user", "content": "a prompt well over five tokens " * 4}], "max_tokens": 2}
    url = f"{router.openai_url}/chat/completions"

    def getex_calls() -> int:
        return int(db.info("commandstats").get("cmdstat_getex", {}).get("calls", 0))

    try:
        headers = {"X-Session-ID": "conv-1"}
        r = httpx.post(url, json={**body, "model": "tiny"}, headers=headers, timeout=30)
        assert r.status_code == 429, r.text
        assert getex_calls() == 0
        r = httpx.post(url, json={**body, "model": "wide"}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        assert getex_calls() == 1  # control: an admitted request does look its session up

        os.kill(redis.process.pid, signal.SIGSTOP)  # every Redis call now waits (redisTimeout 120s)
        try:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json={**body, "model": "wide"}, headers=headers, timeout=1.0)
            # the watcher cancels the wait: recorded as 499 long before the 120 s Redis timeout
            harness.wait_until(lambda: harness.metric_value(
                harness.parse_metrics(router.metrics_text()), "kthena_router_requests_total",
                model="wide", status_code="499") == 1, 30, what="the abandoned request recorded as 499")
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, "kthena_router_ratelimit_decisions_total", model_route="default/wide",
                                    result="admitted") == 1
    finally:
        router.stop()
        sim.stop()
        redis.stop()


def test_section_buckets_in_redis_are_shared_by_routers(tmp_path: Path) -> None:
    """rateLimits.redis: the tenant and API-key buckets (request counts here) live in Redis,
    so two routers together admit exactly a tenant's and a key's limit."""
    redis = redis_harness.start_redis(tmp_path)
    sim = harness.start_simulator(tmp_path, engines=1, fast=True)
    config = harness.write_config(tmp_path / "cfg.yaml", harness.engine_config(sim.ports))
    keys = {"sk-alice-0123456789": ah.api_key("alice", tenant="acme", user="alice"),
            "sk-carol-0123456789": ah.api_key("carol", tenant="acme", user="carol"),
            "sk-bob-0123456789": ah.api_key("bob", tenant="beta", user="bob",
                                            limits={"requestsPerUnit": 3, "unit": "hour"})}
    ah.write_keys_file(tmp_path / "keys.yaml", keys)
    rc = ah.write_router_config(tmp_path / "router.yaml", ah.auth_section(tmp_path / "keys.yaml"), rateLimits={
        "redis": {"address": redis.address}, "leasePercent": 0,  # a round trip per request: exact counts
        "perTenant": {"requestsPerUnit": 5, "unit": "hour"}, "tenants": {"beta": {"requestsPerUnit": 100}}})
    routers = [harness.start_router(config, tmp_path / f"r{i}", extra_args=["--router-config", str(rc)])
               for i in range(2)]
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        with httpx.Client(timeout=30) as http:
            def chat(i: int, key: str) -> httpx.Response:
                return http.post(f"{routers[i % 2].openai_url}/chat/completions", json=body,
                                 headers={"authorization": f"Bearer {key}"})

            acme = [chat(i, "sk-alice-0123456789" if i % 3 else "sk-carol-0123456789").status_code
                    for i in range(8)]
            assert acme == [200] * 5 + [429] * 3, acme  # one tenant bucket for both routers and users
            bob = [chat(i, "sk-bob-0123456789") for i in range(5)]
            assert [r.status_code for r in bob] == [200] * 3 + [429] * 2
            assert bob[3].headers["x-ratelimit-limit-requests"] == "3" and "API key bob" in bob[3].text
        db = redis_lib.Redis(host=harness.HOST, port=redis.port)
        assert db.keys("kthena:rl:tenant:*acme*") and db.keys("kthena:rl:key:bob*")
    finally:
        for r in routers:
            r.stop()
        sim.stop()
        redis.stop()
