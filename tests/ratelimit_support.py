"""What the global rate-limit tests share: Redis + simulator + router replicas with Kthena's
global rateLimit on one ModelServer, the engines' token counts, and the budget checks of
the three-replica tests (test_ratelimit_global.py: routers addressed directly;
test_ratelimit_haproxy.py: behind one haproxy)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

import harness
import redis_harness

LEASE_PERCENT = 1
INPUT_BUDGET, OUTPUT_BUDGET = 30000, 3000  # tokens per hour, routes "demo" and "demo-out"
MAX_TOKENS_OUT = 40  # per request in the output phase (every request uses all of it)

Run = Callable[[str, int], dict[str, int]]  # (model, max_tokens) -> {"ok": n, "refused": n}


def engine_tokens(sim: harness.Simulator) -> tuple[float, float]:
    """(prompt, generated) tokens over all the simulator's engines."""
    prompt = gen = 0.0
    for url in sim.urls:
        fams = harness.parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        prompt += harness.metric_value(fams, "vllm:prompt_tokens_total")
        gen += harness.metric_value(fams, "vllm:generation_tokens_total")
    return prompt, gen


def global_limit_config(sim: harness.Simulator, redis: redis_harness.RedisServer,
                        limits: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One ModelServer; a route per model name in `limits`, each with Kthena's global rateLimit."""
    labels = {"app": "demo"}
    docs: list[dict[str, Any]] = []
    for name, limit in limits.items():
        route = harness.route_doc(name, name, "demo")
        route["spec"]["rateLimit"] = {**limit, "global": {"redis": {"address": redis.address}}}
        docs.append(route)
    return docs + [harness.server_doc("demo", "demo", labels), harness.endpoints_doc("demo-engines", sim.ports, labels)]


@dataclass
class BudgetEnv:
    redis: redis_harness.RedisServer
    sim: harness.Simulator
    routers: list[harness.Router]


@contextlib.contextmanager
def budget_env(tmp_path: Path, replicas: int = 3) -> Iterator[BudgetEnv]:
    """Redis, three engines and `replicas` ready routers sharing the hourly budgets of the
    routes "demo" (input tokens) and "demo-out" (output tokens); stopped on exit."""
    redis = redis_harness.start_redis(tmp_path)
    sim = harness.start_simulator(tmp_path, engines=3, fast=True)
    limits = {"demo": {"inputTokensPerUnit": INPUT_BUDGET, "unit": "hour"},
              "demo-out": {"outputTokensPerUnit": OUTPUT_BUDGET, "unit": "hour"}}
    config = harness.write_config(tmp_path / "cfg.yaml", global_limit_config(sim, redis, limits))
    rc = tmp_path / "router.yaml"
    # A generous redisTimeout: a call slower than it fails open (admitted, not charged), which
    # is the outage behaviour, not the budget arithmetic these tests check; 250 ms (the
    # default) was exceeded on a loaded CI machine.
    rc.write_text(yaml.safe_dump({"rateLimits": {"leasePercent": LEASE_PERCENT, "leaseIdle": "1s",
                                                 "redisTimeout": "10s"}}))
    routers = [harness.start_router(config, tmp_path / f"r{i}", extra_args=["--router-config", str(rc)], wait=False)
               for i in range(replicas)]
    try:
        for r in routers:
            r.wait_ready()
        yield BudgetEnv(redis, sim, routers)
    finally:
        for r in routers:
            r.stop()
        sim.stop()
        redis.stop()


def no_fail_open(env: BudgetEnv) -> None:
    """Every admission was decided on the shared bucket (none failed open on a slow Redis)."""
    opened = sum(harness.metric_value(harness.parse_metrics(r.metrics_text()),
                                      "kthena_router_ratelimit_decisions_total", result="failed_open")
                 for r in env.routers)
    assert opened == 0, f"{opened} admissions failed open (Redis slower than redisTimeout)"


def check_input_budget(env: BudgetEnv, run: Run) -> dict[str, int]:
    """Clients exhaust the input budget: 98-100% of it is admitted (plus what refilled
    meanwhile), at most one lease per replica over."""
    t0 = time.monotonic()
    stats = run("demo", 4)
    prompt, _ = engine_tokens(env.sim)
    refill = INPUT_BUDGET / 3600 * (time.monotonic() - t0)
    lease = INPUT_BUDGET * LEASE_PERCENT / 100
    print(f"input: admitted {prompt:.0f} of {INPUT_BUDGET} (+{refill:.0f} refilled), {stats}")
    no_fail_open(env)
    assert stats["refused"] > 0 and stats["ok"] > 100, stats
    assert 0.98 * INPUT_BUDGET <= prompt <= INPUT_BUDGET + refill + len(env.routers) * lease, (prompt, refill, stats)
    return stats


def check_output_budget(env: BudgetEnv, run: Run, clients: int) -> dict[str, int]:
    """Clients exhaust the output budget; `clients` of them stream at once.

    An admission needs one token (Kthena's rule) and reserves its whole max_tokens, what is
    missing being a debt at once; a router's lease admits alone only a request it covers
    whole, else Redis decides with the lease and its own tokens together. So once the pod's
    tokens (Redis' and the leases') are below one, nothing is admitted: the output ends at
    most one max_tokens over the budget and what refilled meanwhile, plus what streamed
    beyond reservations while its debt was on its way to Redis (a few SSE events per stream).
    Asserted: one max_tokens per router, well inside the issue's bound (the in-flight
    requests' max_tokens, `clients` x max_tokens). Every generated token is charged."""
    before = engine_tokens(env.sim)[1]
    t0 = time.monotonic()
    stats = run("demo-out", MAX_TOKENS_OUT)
    gen = engine_tokens(env.sim)[1] - before
    refill = OUTPUT_BUDGET / 3600 * (time.monotonic() - t0)
    in_flight = clients * MAX_TOKENS_OUT
    over = min(in_flight, len(env.routers) * MAX_TOKENS_OUT)
    print(f"output: {gen:.0f} of {OUTPUT_BUDGET} (+{refill:.0f} refilled, bound +{over}; the issue's, in flight: "
          f"+{in_flight}), {stats}")
    no_fail_open(env)
    assert stats["refused"] > 0, stats
    assert 0.98 * OUTPUT_BUDGET <= gen <= OUTPUT_BUDGET + refill + over, (gen, refill, stats)
    charged = sum(harness.metric_value(harness.parse_metrics(r.metrics_text()),
                                       "kthena_router_ratelimit_charged_tokens_total", token_type="output")
                  for r in env.routers)
    assert charged == engine_tokens(env.sim)[1]
    return stats
