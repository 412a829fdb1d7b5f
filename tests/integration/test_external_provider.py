"""ExternalModelProvider targets end to end: a real router process in front of a local
HTTPS stub provider (tests/external_stub.py, certificate from a CA made here) and the
engine simulator. No traffic leaves the machine.

Router A has a router configuration (CA bundle, API keys, a request limit); router B has
none, so its providers are verified against the system store (where the test CA is not).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import harness
from external_stub import StubProvider, make_pki

API = harness.ROUTE_API
BEARER_KEY = "sk-bearer-123-do-not-leak"
FILE_KEY = "ant-file-key-456-do-not-leak"
CLIENT_KEY = "client-key-789"
SECRET_LABEL = {"networking.serving.volcano.sh/external-model-provider-credential": "true"}
N_SPLIT = 100
WEIGHT_EXT = 30


def _provider(name: str, base_url: str, *, ptype: str = "OpenAI", model: str | None = None,
              auth: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None, skip: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"providerType": ptype, "baseURL": base_url}
    if model is not None:
        spec["model"] = model
    if auth is not None:
        spec["auth"] = auth
    if headers:
        spec["headers"] = headers
    if skip is not None:
        spec["insecureSkipVerify"] = skip
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": API, "kind": "ExternalModelProvider", "metadata": meta, "spec": spec}


def _ext_route(name: str, model: str, targets: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ModelRoute", "metadata": {"name": name},
            "spec": {"modelName": model, "rules": [{"name": "default", "targetModels": targets}]}}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_pki(tmp_path_factory.mktemp("pki"), "a")


@pytest.fixture(scope="module")
def stub(pki: Any) -> Iterator[StubProvider]:
    s = StubProvider(pki)
    s.state.expect = {"/bearer": ("authorization", f"Bearer {BEARER_KEY}"), "/apikey": ("x-api-key", BEARER_KEY),
                      "/anthropic": ("x-api-key", FILE_KEY), "/tls": ("authorization", f"Bearer {BEARER_KEY}")}
    yield s
    s.close()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    s = harness.start_simulator(tmp_path_factory.mktemp("sim"), engines=1, model="demo", fast=True)
    yield s
    s.stop()


def _secret() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "oai-key", "labels": SECRET_LABEL},
            "type": "Opaque", "data": {"api-key": base64.b64encode(BEARER_KEY.encode()).decode()}}


@pytest.fixture(scope="module")
def router_a(stub: StubProvider, sim: harness.Simulator, pki: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work = tmp_path_factory.mktemp("router-a")
    (work / "ant.key").write_text(FILE_KEY + "\n")
    port = stub.port
    secret_ref = {"secretRef": {"name": "oai-key", "key": "api-key"}}
    docs = [
        _ext_route("gpt", "gpt", [{"externalModelProviderName": "oai"}]),
        _ext_route("gpt-key", "gpt-key", [{"externalModelProviderName": "oai-key"}]),
        _ext_route("claude", "claude", [{"externalModelProviderName": "ant"}]),
        _ext_route("split", "split", [{"modelServerName": "demo", "weight": 100 - WEIGHT_EXT},
                                      {"externalModelProviderName": "oai", "weight": WEIGHT_EXT}]),
        _ext_route("limited", "limited", [{"externalModelProviderName": "oai"}]),
        _provider("oai", f"https://127.0.0.1:{port}/bearer/v1", model="up-gpt",
                  auth={"scheme": "Bearer", **secret_ref}, headers={"X-Org": "org-1"}),
        _provider("oai-key", f"https://localhost:{port}/apikey", auth={"scheme": "APIKey", **secret_ref}),
        _provider("ant", f"https://127.0.0.1:{port}/anthropic", ptype="Anthropic",
                  annotations={"router.kthena.io/credential-file": "ant.key"}),
        _secret(),
        harness.server_doc("demo", "demo", {"app": "demo"}),
        harness.endpoints_doc("demo-engines", sim.ports, {"app": "demo"}),
    ]
    config = harness.write_config(work / "routes.yaml", docs)
    (work / "keys.yaml").write_text(
        f"keys:\n- name: tester\n  sha256: {hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}\n  tenant: t1\n")
    rc = work / "router-config.yaml"
    rc.write_text(json.dumps({
        "externalProviders": {"caFile": str(pki.ca_pem), "timeouts": {"response": "30s"}},
        "auth": {"apiKeysFile": "keys.yaml"},
        "rateLimits": {"routes": {"limited": {"route": {"requestsPerUnit": 2, "unit": "minute"}}}},
    }))
    router = harness.start_router(config, work, extra_args=["--router-config", str(rc)])
    yield router
    router.stop()


@pytest.fixture
def client(router_a: harness.Router, stub: StubProvider) -> openai.OpenAI:
    stub.reset()
    return _sdk(router_a, CLIENT_KEY)


def _sdk(router: harness.Router, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.openai_url, api_key=key, max_retries=0, timeout=60.0)


def _no_client_key(stub: StubProvider) -> None:
    for s in stub.seen():
        assert not any(CLIENT_KEY in v for v in s.headers.values()), s.headers


def test_chat_bearer_secret_model_override_and_headers(client: openai.OpenAI, stub: StubProvider) -> None:
    r = client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert r.choices[0].message.content == "stub answer from up-gpt"
    [s] = stub.seen()
    assert s.path == "/bearer/v1/chat/completions"  # base path ending in /v1: not doubled
    assert s.headers["authorization"] == f"Bearer {BEARER_KEY}"
    assert s.headers["x-org"] == "org-1"
    assert "x-api-key" not in s.headers and "cookie" not in s.headers
    assert s.body["model"] == "up-gpt"
    assert not any(k.startswith("x-stainless") for k in s.headers)  # only the allow-list goes out
    _no_client_key(stub)


def test_openai_paths_plain_and_streamed(client: openai.OpenAI, stub: StubProvider) -> None:
    chunks = list(client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == \
        "stub answer from up-gpt"
    assert all(c.choices for c in chunks)  # the usage chunk the router asked for is hidden
    assert stub.seen()[-1].body["stream_options"] == {"include_usage": True}
    c = client.completions.create(model="gpt", prompt="hi", max_tokens=5)
    assert c.choices[0].text == "stub answer from up-gpt"
    text = "".join(ch.choices[0].text for ch in client.completions.create(model="gpt", prompt="hi", stream=True))
    assert text.strip() == "stub answer from up-gpt"
    r = client.responses.create(model="gpt", input="hi")
    assert r.output_text == "stub answer from up-gpt"
    events = list(client.responses.create(model="gpt", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    assert [s.path for s in stub.seen()] == ["/bearer/v1/chat/completions", "/bearer/v1/completions",
                                             "/bearer/v1/completions", "/bearer/v1/responses",
                                             "/bearer/v1/responses"]
    _no_client_key(stub)


def test_apikey_scheme_dns_name_and_path_prefix(client: openai.OpenAI, stub: StubProvider) -> None:
    r = client.chat.completions.create(model="gpt-key", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "stub answer from gpt-key"  # no override: the client's model
    [s] = stub.seen()
    assert s.path == "/apikey/chat/completions"  # OpenAI type: /v1 dropped after a base path
    assert s.headers["x-api-key"] == BEARER_KEY and "authorization" not in s.headers
    assert s.headers["host"] == f"localhost:{stub.port}"


def test_anthropic_messages_with_file_credential(router_a: harness.Router, stub: StubProvider) -> None:
    stub.reset()
    hdrs = {"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "b1"}
    body = {"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{router_a.base_url}/v1/messages", json=body, headers=hdrs)
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["text"] == "stub answer from claude"
        with http.stream("POST", f"{router_a.base_url}/v1/messages", json={**body, "stream": True},
                         headers=hdrs) as sr:
            assert sr.status_code == 200
            raw = b"".join(sr.iter_bytes()).decode()
        # an OpenAI-type provider does not serve the Messages API
        bad = http.post(f"{router_a.base_url}/v1/messages", json={**body, "model": "gpt"}, headers=hdrs)
    assert "event: message_stop" in raw and "[DONE]" not in raw
    deltas = [json.loads(line[5:])["delta"]["text"] for line in raw.splitlines()
              if line.startswith("data:") and "text_delta" in line]
    assert "".join(deltas).strip() == "stub answer from claude"
    seen = stub.seen()
    assert [s.path for s in seen] == ["/anthropic/v1/messages"] * 2
    for s in seen:
        assert s.headers["x-api-key"] == FILE_KEY  # the provider's key replaced the client's
        assert s.headers["anthropic-version"] == "2023-06-01" and s.headers["anthropic-beta"] == "b1"
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert "/v1/messages is not served by ExternalModelProvider default/oai" in err["message"]
    assert "providerType OpenAI" in err["message"]
    _no_client_key(stub)


def test_weighted_split_between_pods_and_provider(client: openai.OpenAI, stub: StubProvider,
                                                  sim: harness.Simulator) -> None:
    sim.reset_requests()
    for _ in range(N_SPLIT):
        client.chat.completions.create(model="split", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    ext = len(stub.seen())
    pods = sim.received()[0]
    assert ext + pods == N_SPLIT
    # binomial(100, 0.3): sd ~4.6; +-3.3 sd
    assert 15 <= ext <= 45, (ext, pods)


def test_auth_and_rate_limit_still_apply(router_a: harness.Router, stub: StubProvider) -> None:
    stub.reset()
    anon = _sdk(router_a, "wrong-key")
    with pytest.raises(openai.AuthenticationError):
        anon.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}])
    assert stub.seen() == []
    c = _sdk(router_a, CLIENT_KEY)
    for _ in range(2):
        c.chat.completions.create(model="limited", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model="limited", messages=[{"role": "user", "content": "hi"}])
    assert len(stub.seen()) == 2


def test_provider_labels_in_metrics_and_no_key_anywhere(client: openai.OpenAI, router_a: harness.Router) -> None:
    client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}])
    text = router_a.metrics_text()
    fams = harness.parse_metrics(text)
    assert harness.metric_value(fams, "kthena_router_requests_total", model_server="external:default/oai") >= 1
    for secret in (BEARER_KEY, FILE_KEY):
        assert secret not in text
        assert secret not in router_a.process.stdout() + router_a.process.stderr()


# --- router B: no router configuration, so the system CA store ----------------------------


@pytest.fixture(scope="module")
def router_b(stub: StubProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work = tmp_path_factory.mktemp("router-b")
    secret_ref = {"secretRef": {"name": "oai-key", "key": "api-key"}}
    docs = [
        _ext_route("verified", "verified", [{"externalModelProviderName": "verified"}]),
        _ext_route("skip", "skip", [{"externalModelProviderName": "skip"}]),
        _provider("verified", f"https://127.0.0.1:{stub.port}/tls", auth=secret_ref),
        _provider("skip", f"https://localhost:{stub.port}/tls", auth=secret_ref, skip=True),
        _secret(),
    ]
    router = harness.start_router(harness.write_config(work / "routes.yaml", docs), work)
    yield router
    router.stop()


def test_verification_on_by_default_and_insecure_skip_verify(router_b: harness.Router, stub: StubProvider) -> None:
    stub.reset()
    c = router_b.openai()
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{router_b.base_url}/v1/chat/completions",
                      json={"model": "verified", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502
    msg = r.json()["error"]["message"]
    assert "ExternalModelProvider default/verified" in msg and "TLS certificate verification failed" in msg
    assert BEARER_KEY not in r.text
    assert stub.seen() == []  # nothing was sent over the unverified connection
    ok = c.chat.completions.create(model="skip", messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content == "stub answer from skip"
    assert [s.path for s in stub.seen()] == ["/tls/chat/completions"]
    assert BEARER_KEY not in router_b.process.stdout() + router_b.process.stderr() + router_b.metrics_text()


def test_reload_with_a_missing_secret_keeps_the_old_config(router_b: harness.Router, stub: StubProvider) -> None:
    good = router_b.config_path.read_text()
    docs = [
        _ext_route("skip", "skip", [{"externalModelProviderName": "skip"}]),
        _provider("skip", f"https://localhost:{stub.port}/tls", skip=True,
                  auth={"secretRef": {"name": "gone", "key": "api-key"}}),
    ]
    harness.write_config(router_b.config_path, docs)
    try:
        r = router_b.reload()
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["field"] == "spec.auth.secretRef.name" and "ExternalModelProvider default/skip" in err["document"]
        assert "Secret 'gone' not found" in err["message"]
        stub.reset()
        ok = router_b.openai().chat.completions.create(model="skip", messages=[{"role": "user", "content": "hi"}])
        assert ok.choices[0].message.content == "stub answer from skip"
        assert stub.seen()[0].headers["authorization"] == f"Bearer {BEARER_KEY}"  # the old provider, old key
    finally:
        harness.write_config(router_b.config_path, good)
        assert router_b.reload().status_code == 200
