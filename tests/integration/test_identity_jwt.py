"""JWT as Kthena configures it (auth: issuer, audiences, jwksUri): a real JWKS served over
HTTP on 127.0.0.1, real router processes, the real OpenAI SDK seeing AuthenticationError."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import auth_harness as ah
import harness
import jwt_keys as jk

AUTH_TOTAL = "kthena_router_auth_requests_total"
FETCHES = "kthena_router_auth_jwks_fetches_total"
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RSA, EC, ED = jk.new_key("rsa-1"), jk.new_key("ec-1", "ES256"), jk.new_key("ed-1", "EdDSA")


def _chat(router: harness.Router, token: str) -> Any:
    client = openai.OpenAI(base_url=router.openai_url, api_key=token, max_retries=0, timeout=30)
    return client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def _refusal(router: harness.Router, token: str) -> dict[str, Any]:
    with pytest.raises(openai.AuthenticationError) as ei:
        _chat(router, token)
    assert ei.value.status_code == 401
    return ei.value.body  # type: ignore[no-any-return]


def _post(http: httpx.Client, router: harness.Router, token: str) -> httpx.Response:
    return http.post(f"{router.openai_url}/chat/completions", json=CHAT,
                     headers={"authorization": f"Bearer {token}", "connection": "close"})


def _metric(router: harness.Router, name: str, **labels: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), name, **labels)


def _start(tmp_path: Path, simulator: harness.Simulator, workers: int, jwks_url: str, **auth: Any) -> harness.Router:
    section = {"issuer": "https://idp.test", "audiences": ["kthena-router"], "jwksUri": jwks_url,
               "clockSkewSeconds": 5, "tenantClaim": "org", "priorityClaim": "tier", **auth}
    rc = ah.write_router_config(tmp_path / "rc" / "router-config.yaml", section)
    config = harness.write_config(tmp_path / "cfg" / "routes.yaml", harness.engine_config(simulator.ports))
    return harness.start_router(config, tmp_path, workers=workers, extra_args=["--router-config", str(rc)])


@pytest.fixture
def jwks_server() -> Any:
    yield from jk.serve(jk.jwks(RSA, EC, ED))


def test_jwt_good_and_every_refusal(simulator: harness.Simulator, tmp_path: Path, router_workers: int,
                                    jwks_server: jk.JwksServer) -> None:
    router = _start(tmp_path, simulator, router_workers, jwks_server.url,
                    jwksRefreshInterval="1h", jwksRefetchMinInterval="1s")
    http = httpx.Client(timeout=30)
    try:
        for key in (RSA, EC, ED):  # the default allow-list: RS256, ES256, EdDSA
            assert _chat(router, key.sign(jk.claims(org="acme", tier="gold"))).choices[0].message.content

        now = int(time.time())
        cases = {
            "token_expired": RSA.sign(jk.claims(org="acme", ttl=-60)),
            "token_not_yet_valid": RSA.sign(jk.claims(org="acme", nbf=now + 120)),
            "invalid_audience": RSA.sign(jk.claims(org="acme", aud="someone-else")),
            "invalid_issuer": RSA.sign(jk.claims(org="acme", iss="https://evil.test")),
            "invalid_signature": jk.tampered(RSA.sign(jk.claims(org="acme"))),
            "missing_claim": RSA.sign(jk.claims()),  # no tenant claim
        }
        messages = set()
        for code, token in cases.items():
            body = _refusal(router, token)
            assert body["code"] == code, (code, body)
            messages.add(body["message"])
        assert len(messages) == len(cases)  # every reason distinct in the message

        body = _refusal(router, jk.unsigned(jk.claims(org="acme"), "rsa-1"))
        assert body["code"] == "disallowed_alg" and "'none'" in body["message"]
        body = _refusal(router, jk.hmac_with_public_key(jk.claims(org="acme"), RSA))
        assert body["code"] == "disallowed_alg" and "'HS256'" in body["message"]

        r = _post(http, router, cases["token_expired"])
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == ('Bearer realm="kthena-router", error="invalid_token", '
                                                 'error_description="the token has expired"')

        assert _metric(router, AUTH_TOTAL, source="jwt", result="ok") == 3
        assert _metric(router, AUTH_TOTAL, source="jwt", result="token_expired") == 2
        assert _metric(router, AUTH_TOTAL, source="jwt", result="disallowed_alg") == 2
    finally:
        http.close()
        router.stop()


def test_unknown_kid_refetches_once_rate_limited_then_rotated_in(
        simulator: harness.Simulator, tmp_path: Path, router_workers: int, jwks_server: jk.JwksServer) -> None:
    # a one-hour refresh: only the unknown-kid refetch can bring the new key in time
    router = _start(tmp_path, simulator, router_workers, jwks_server.url,
                    jwksRefreshInterval="1h", jwksRefetchMinInterval="2s")
    http = httpx.Client(timeout=30)
    try:
        harness.wait_until(lambda: jwks_server.fetches >= router.workers, 10, what="the first JWKS fetch")
        assert _post(http, router, RSA.sign(jk.claims(org="acme"))).status_code == 200
        rotated = jk.new_key("rsa-2")
        time.sleep(2.2)  # the first fetch counts against the refetch rate limit too
        base = jwks_server.fetches
        for _ in range(20):  # a burst of unknown-kid tokens: at most one refetch per worker
            r = _post(http, router, rotated.sign(jk.claims(org="acme")))
            assert r.status_code == 401 and r.json()["error"]["code"] == "unknown_kid", r.text
            assert "'rsa-2'" in r.json()["error"]["message"]
        assert 1 <= jwks_server.fetches - base <= router.workers

        jwks_server.doc = jk.jwks(RSA, rotated)  # the identity provider rotates the key in
        time.sleep(2.2)  # past the refetch rate limit
        assert _chat(router, rotated.sign(jk.claims(org="acme"))).choices[0].message.content
        harness.wait_until(lambda: all(_post(http, router, rotated.sign(jk.claims(org="acme"))).status_code == 200
                                       for _ in range(6)), 15, interval=0.5, what="every worker has rsa-2")
    finally:
        http.close()
        router.stop()


def test_jwks_server_down_keeps_the_last_good_keys(
        simulator: harness.Simulator, tmp_path: Path, router_workers: int, jwks_server: jk.JwksServer) -> None:
    router = _start(tmp_path, simulator, router_workers, jwks_server.url,
                    jwksRefreshInterval="1s", jwksRefetchMinInterval="1s")
    http = httpx.Client(timeout=30)
    try:
        harness.wait_until(lambda: _metric(router, FETCHES, result="ok") >= router.workers, 15,
                           what="the first JWKS fetch")
        jwks_server.down = True
        errors = _metric(router, FETCHES, result="error")
        harness.wait_until(lambda: _metric(router, FETCHES, result="error") >= errors + 2 * router.workers, 30,
                           interval=0.2, what="refreshes failing")
        for _ in range(6):  # fresh tokens: verified against the kept keys, not a cached verdict
            assert _post(http, router, EC.sign(jk.claims(org="acme", jti=str(time.time_ns())))).status_code == 200
        assert _metric(router, "kthena_router_auth_jwks_keys") == 3
        # and a JWKS that answers garbage is no better than none
        jwks_server.down, jwks_server.doc = False, {"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}
        invalid = _metric(router, FETCHES, result="invalid")
        harness.wait_until(lambda: _metric(router, FETCHES, result="invalid") > invalid, 30, interval=0.2,
                           what="an invalid JWKS fetched")
        assert _post(http, router, RSA.sign(jk.claims(org="acme", jti="x"))).status_code == 200
    finally:
        http.close()
        router.stop()
