"""Token rate limits with local buckets: Kthena's ModelRoute.rateLimit, the rateLimits
section (tenants through API keys, request counts, prompt cap), refusals as OpenAI's, and
charged tokens equal to the engines' own counters."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

import auth_harness as ah
import harness
import ratelimit_support as rs

PROMPT = "hello there " * 20
CHARGED = "kthena_router_ratelimit_charged_tokens_total"


def _chat(http: httpx.Client, router: harness.Router, i: int, headers: dict[str, str] | None = None,
          content: str = PROMPT) -> httpx.Response:
    body: dict[str, Any] = {"model": "demo", "messages": [{"role": "user", "content": content}], "max_tokens": 5}
    if i % 3 == 1:
        body["stream"] = True  # the router asks the engine for usage and hides that chunk
    elif i % 3 == 2:
        body.update(stream=True, stream_options={"include_usage": True})
    return http.post(f"{router.openai_url}/chat/completions", json=body, headers=headers or {})


def _check_refusal(r: httpx.Response, kind: str, limit: int) -> None:
    assert r.status_code == 429, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "RateLimitError" and err["code"] == "rate_limit_exceeded" and err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    assert int(r.headers["retry-after"]) >= 1
    assert int(r.headers["retry-after-ms"]) >= 1
    assert r.headers[f"x-ratelimit-limit-{kind}"] == str(limit)
    assert 0 <= int(r.headers[f"x-ratelimit-remaining-{kind}"]) < limit
    assert re.fullmatch(r"(\d+h)?(\d+m)?[\d.]+m?s", r.headers[f"x-ratelimit-reset-{kind}"])


def test_kthena_route_limit_refuses_like_openai_and_charges_what_engines_count(tmp_path: Path) -> None:
    sim = harness.start_simulator(tmp_path, engines=2, fast=True)
    docs = harness.engine_config(sim.ports)
    docs[0]["spec"]["rateLimit"] = {"inputTokensPerUnit": 3000, "outputTokensPerUnit": 100000, "unit": "hour"}
    router = harness.start_router(harness.write_config(tmp_path / "cfg.yaml", docs), tmp_path)
    try:
        statuses = []
        with httpx.Client(timeout=30) as http:
            for i in range(60):
                r = _chat(http, router, i)
                statuses.append(r.status_code)
                if r.status_code == 200 and i % 3 == 1:
                    # the usage chunk the client did not ask for never reaches it
                    assert '"usage"' not in r.text and r.text.rstrip().endswith("data: [DONE]")
                if r.status_code == 200 and i % 3 == 2:
                    assert '"usage"' in r.text
                if r.status_code == 429:
                    _check_refusal(r, "tokens", 3000)
        first_refusal = statuses.index(429)
        assert 20 <= first_refusal and all(s == 429 for s in statuses[first_refusal:]), statuses
        # the real SDK sees its RateLimitError
        with pytest.raises(openai.RateLimitError) as ei:
            router.openai().chat.completions.create(model="demo", messages=[{"role": "user", "content": PROMPT * 2}])
        assert ei.value.response.headers["x-ratelimit-limit-tokens"] == "3000"
        prompt, gen = rs.engine_tokens(sim)
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, CHARGED, token_type="input") == prompt
        assert harness.metric_value(fams, CHARGED, token_type="output") == gen > 0
        assert 0.95 * 3000 <= prompt <= 3000  # admitted up to the budget, never over it here
        assert harness.metric_value(fams, "kthena_router_rate_limit_exceeded_total", limit_type="input_tokens") >= 1
    finally:
        router.stop()
        sim.stop()


def test_output_limit_charges_streamed_tokens_and_admits_while_budget_is_left(tmp_path: Path) -> None:
    sim = harness.start_simulator(tmp_path, engines=1, fast=True)
    docs = harness.engine_config(sim.ports)
    docs[0]["spec"]["rateLimit"] = {"outputTokensPerUnit": 100, "unit": "hour"}
    router = harness.start_router(harness.write_config(tmp_path / "cfg.yaml", docs), tmp_path)
    try:
        ok = 0
        with httpx.Client(timeout=30) as http:
            for i in range(40):
                r = http.post(f"{router.openai_url}/chat/completions",
                              json={"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 30, "stream": True})
                if r.status_code == 429:
                    _check_refusal(r, "tokens", 100)
                    break
                ok += 1
        _, gen = rs.engine_tokens(sim)
        # admitted while one output token was left; the last one may run over by its max_tokens
        assert 100 <= gen <= 100 + 30 and ok >= 4, (ok, gen)
        assert harness.metric_value(harness.parse_metrics(router.metrics_text()), CHARGED,
                                    token_type="output") == gen
    finally:
        router.stop()
        sim.stop()


def test_tenant_request_limits_api_key_limits_and_prompt_cap(tmp_path: Path) -> None:
    sim = harness.start_simulator(tmp_path, engines=1, fast=True)
    config = harness.write_config(tmp_path / "cfg.yaml", harness.engine_config(sim.ports))
    keys = {
        "sk-alice-0123456789": ah.api_key("alice", tenant="acme", user="alice"),
        "sk-carol-0123456789": ah.api_key("carol", tenant="acme", user="carol"),
        "sk-bob-0123456789": ah.api_key("bob", tenant="beta", user="bob",
                                        limits={"requestsPerUnit": 3, "unit": "hour"}),
    }
    ah.write_keys_file(tmp_path / "keys.yaml", keys)
    rc = ah.write_router_config(tmp_path / "router.yaml", ah.auth_section(tmp_path / "keys.yaml"), rateLimits={
        "perTenant": {"requestsPerUnit": 4, "unit": "hour"},
        "tenants": {"beta": {"requestsPerUnit": 100, "unit": "hour"}},
        "maxPromptTokens": 400,
    })
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)])

    def as_(key: str, i: int = 0, content: str = PROMPT) -> httpx.Response:
        return _chat(http, router, i, {"authorization": f"Bearer {key}"}, content)

    try:
        with httpx.Client(timeout=30) as http:
            assert [as_("sk-alice-0123456789", i).status_code for i in range(3)] == [200] * 3
            assert as_("sk-carol-0123456789").status_code == 200  # acme's 4th request
            r = as_("sk-carol-0123456789")  # acme's 5th: the tenant's bucket, not carol's
            _check_refusal(r, "requests", 4)
            assert "tenant acme" in r.json()["error"]["message"]
            # beta has its own tenant limit (100); bob's key allows 3 an hour
            assert [as_("sk-bob-0123456789", i).status_code for i in range(3)] == [200] * 3
            r = as_("sk-bob-0123456789")
            _check_refusal(r, "requests", 3)
            assert "API key bob" in r.json()["error"]["message"]
            # prompt cap: about 3000 tokens estimated > 400
            r = as_("sk-alice-0123456789", content="word " * 3000)
            assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long"
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, "kthena_router_ratelimit_decisions_total", result="limited",
                                    reason="requests/tenant") == 1
        assert harness.metric_value(fams, "kthena_router_ratelimit_decisions_total", result="too_long") == 1
    finally:
        router.stop()
        sim.stop()


def test_bad_key_limits_or_section_refused_at_load(tmp_path: Path) -> None:
    sim_ports = [harness.free_port()]
    config = harness.write_config(tmp_path / "cfg.yaml", harness.engine_config(sim_ports))
    rc = tmp_path / "router.yaml"
    rc.write_text(yaml.safe_dump({"rateLimits": {"perTenant": {"requestsPerUnit": 0, "unit": "week"}}}))
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)], wait=False)
    code = router.process.wait(60)
    assert code == 2
    err = router.process.stderr() + router.process.stdout()
    assert "rateLimits.perTenant.requestsPerUnit" in err and "rateLimits.perTenant.unit" in err
