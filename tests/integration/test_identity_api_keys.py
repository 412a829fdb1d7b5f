"""API keys (router configuration `auth.apiKeysFile`): real router processes, the real
OpenAI SDK, the keys file reloaded like the route config."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import auth_harness as ah
import harness

KEYS = {
    "sk-alice-0123456789": ah.api_key("alice-laptop", tenant="acme", user="alice", priority="high",
                                      limits={"tokensPerMinute": 1000}),
    "sk-bob-0123456789": ah.api_key("bob-ci", tenant="beta", user="bob"),
}
AUTH_TOTAL = "kthena_router_auth_requests_total"
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _client(router: harness.Router, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.openai_url, api_key=key, max_retries=0, timeout=30)


def _chat(router: harness.Router, key: str) -> Any:
    return _client(router, key).chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                         max_tokens=2)


def _post(http: httpx.Client, router: harness.Router, headers: dict[str, str]) -> httpx.Response:
    # a fresh connection per request: with several workers, each one is asked in turn
    return http.post(f"{router.openai_url}/chat/completions", json=CHAT, headers={"connection": "close", **headers})


def _refused_by_all(http: httpx.Client, router: harness.Router, headers: dict[str, str], n: int = 12) -> bool:
    return all(_post(http, router, headers).status_code == 401 for _ in range(n))


@pytest.fixture
def setup(simulator: harness.Simulator, tmp_path: Path, router_workers: int) -> Any:
    keys_path = ah.write_keys_file(tmp_path / "auth" / "api-keys.yaml", KEYS)
    rc = ah.write_router_config(tmp_path / "auth" / "router-config.yaml", ah.auth_section(Path("api-keys.yaml")))
    config = harness.write_config(tmp_path / "cfg" / "routes.yaml", harness.engine_config(simulator.ports))
    router = harness.start_router(config, tmp_path, workers=router_workers, extra_args=["--router-config", str(rc)])
    http = httpx.Client(timeout=30)
    try:
        yield router, keys_path, http
    finally:
        http.close()
        router.stop()


def test_good_key_passes_and_bad_or_missing_key_gets_401(setup: Any, simulator: harness.Simulator) -> None:
    router, _, http = setup
    reply = _chat(router, "sk-alice-0123456789")
    assert reply.choices[0].message.content

    with pytest.raises(openai.AuthenticationError) as ei:
        _chat(router, "sk-mallory")
    assert ei.value.status_code == 401
    body = ei.value.body
    assert body["code"] == "invalid_api_key" and body["type"] == "AuthenticationError"
    assert body["message"] == "invalid API key"

    r = _post(http, router, {"authorization": "Bearer sk-mallory"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == \
        'Bearer realm="kthena-router", error="invalid_token", error_description="invalid API key"'
    assert r.headers["x-request-id"]

    # RFC 6750 3.1: no credentials -> the challenge without an error code
    r = _post(http, router, {})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_credentials"
    assert r.headers["www-authenticate"] == 'Bearer realm="kthena-router"'
    r = _post(http, router, {"authorization": "Basic YWxpY2U6cHc="})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unsupported_scheme"

    # x-api-key (Anthropic-style clients) works too; no client credential reaches an engine
    simulator.reset_requests()
    r = _post(http, router, {"x-api-key": "sk-bob-0123456789"})
    assert r.status_code == 200, r.text
    _chat(router, "sk-alice-0123456789")
    seen = [e["headers"] for i in range(len(simulator.ports)) for e in simulator.requests(i)["log"]]
    assert len(seen) == 2
    assert not any("authorization" in h or "x-api-key" in h for h in seen)

    # /v1/models needs credentials too when auth is on
    assert http.get(f"{router.openai_url}/models").status_code == 401
    models = _client(router, "sk-bob-0123456789").models.list()
    assert [m.id for m in models.data] == ["demo"]

    fams = harness.parse_metrics(router.metrics_text())
    assert harness.metric_value(fams, AUTH_TOTAL, source="api_key", result="ok") == 4
    assert harness.metric_value(fams, AUTH_TOTAL, source="api_key", result="invalid_api_key") == 2
    assert harness.metric_value(fams, AUTH_TOTAL, source="none", result="missing_credentials") == 2
    assert harness.metric_value(fams, "kthena_router_auth_api_keys") == 2


def test_revoked_by_reload_and_bad_file_keeps_the_old_keys(setup: Any) -> None:
    router, keys_path, http = setup
    alice = {"authorization": "Bearer sk-alice-0123456789"}
    bob = {"authorization": "Bearer sk-bob-0123456789"}
    assert _post(http, router, alice).status_code == 200
    assert _post(http, router, bob).status_code == 200

    # revoke bob: remove his entry; the file is watched like the route config
    ah.write_keys_file(keys_path, {k: v for k, v in KEYS.items() if "bob" not in k})
    harness.wait_until(lambda: _refused_by_all(http, router, bob), 30, interval=0.2, what="bob's key revoked")
    assert _post(http, router, alice).status_code == 200

    # a bad file (a plain key instead of its hash): the old keys stay, the log names file and field
    before = harness.metric_value(harness.parse_metrics(router.metrics_text()),
                                  "kthena_router_auth_api_keys_reloads_total", result="failure")
    ah.write_text(keys_path, "keys:\n- name: carol\n  key: sk-carol\n  tenant: acme\n"
                             f"- name: dave\n  sha256: {hashlib.sha256(b'x').hexdigest()[:10]}\n  tenant: acme\n")
    harness.wait_until(lambda: harness.metric_value(
        harness.parse_metrics(router.metrics_text()), "kthena_router_auth_api_keys_reloads_total",
        result="failure") >= before + router.workers, 30, interval=0.2, what="the bad keys file reported")
    log = router.process.stderr() + router.process.stdout()
    assert f"{keys_path}: keys[0].key: a keys file never holds a key itself" in log
    assert f"{keys_path}: keys[1].sha256: must be the 64 hex digits" in log
    for _ in range(6):
        assert _post(http, router, alice).status_code == 200
        assert _post(http, router, bob).status_code == 401

    # POST /admin/reload validates the keys file with the router configuration: 400 naming it
    r = router.reload()
    assert r.status_code == 400, r.text
    assert str(keys_path) in r.json()["error"]["message"] and "keys[0].key" in r.json()["error"]["message"]

    # fixed: bob is back
    ah.write_keys_file(keys_path, KEYS)
    harness.wait_until(lambda: all(_post(http, router, bob).status_code == 200 for _ in range(6)), 30,
                       interval=0.2, what="bob's key back")


def test_bad_keys_file_at_start_exits_naming_file_and_field(tmp_path: Path, simulator: harness.Simulator) -> None:
    keys_path = ah.write_text(tmp_path / "keys.yaml", "keys:\n- name: a\n  sha256: nothex\n  tenant: acme\n")
    rc = ah.write_router_config(tmp_path / "rc.yaml", ah.auth_section(keys_path))
    config = harness.write_config(tmp_path / "routes.yaml", harness.engine_config(simulator.ports))
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)], wait=False)
    try:
        assert router.process.wait(60) == 2
        err = router.process.stderr()
        assert f"{rc}: document 1: auth.apiKeysFile: {keys_path}: keys[0].sha256: must be the 64 hex digits" in err
    finally:
        router.stop()


def test_auth_turned_on_and_off_by_a_router_configuration_reload(simulator: harness.Simulator, tmp_path: Path,
                                                                 router_workers: int) -> None:
    ah.write_keys_file(tmp_path / "rc" / "keys.yaml", KEYS)
    rc = ah.write_text(tmp_path / "rc" / "router-config.yaml", "auth: {}\n")  # Kthena's empty placeholder: off
    config = harness.write_config(tmp_path / "cfg" / "routes.yaml", harness.engine_config(simulator.ports))
    router = harness.start_router(config, tmp_path, workers=router_workers, extra_args=["--router-config", str(rc)])
    http = httpx.Client(timeout=30)
    try:
        assert _post(http, router, {}).status_code == 200
        ah.write_router_config(rc, ah.auth_section(Path("keys.yaml")))
        harness.wait_until(lambda: _refused_by_all(http, router, {}), 30, interval=0.2, what="auth on")
        assert _post(http, router, {"authorization": "Bearer sk-alice-0123456789"}).status_code == 200
        ah.write_text(rc, "auth: {}\n")
        harness.wait_until(lambda: all(_post(http, router, {}).status_code == 200 for _ in range(6)), 30,
                           interval=0.2, what="auth off")
    finally:
        http.close()
        router.stop()
