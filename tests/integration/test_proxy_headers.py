"""Model rewrite, headers to and from engines, upstream credentials, body size limit.

Besides the simulator, a tiny header-echo engine (a real aiohttp process) shows exactly
which headers and body bytes reach an engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import harness
import httpx
import openai
import pytest

MAX_BODY = 4096
TOKEN = "upstream-secret-token"

ECHO_ENGINE = r'''
import json, sys
from aiohttp import web

async def echo(request):
    raw = await request.read()
    payload = {"id": "echo", "object": "chat.completion", "model": "echo",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
               "echo": {"headers": [[k, v] for k, v in request.headers.items()],
                        "body": raw.decode(), "path": request.path}}
    return web.json_response(payload, headers={"X-Engine-Header": "kept", "Connection": "keep-alive"})

async def health(request):
    return web.Response(text="ok")

app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_get("/health", health)
app.router.add_post("/{tail:.*}", echo)
print(json.dumps({"ready": True}), flush=True)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


@pytest.fixture(scope="module")
def echo_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with harness.script_engine("echo-engine", ECHO_ENGINE, tmp_path_factory.mktemp("echo")) as port:
        yield port


@pytest.fixture(scope="module")
def hdr_router(router_workers: int, simulator_session: harness.Simulator, echo_port: int,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work = tmp_path_factory.mktemp(f"headers-w{router_workers}")
    (work / "token").write_text(TOKEN + "\n")
    sim_labels = {"app": "sim"}
    echo_labels = {"app": "echo"}
    docs = [
        harness.route_doc("public", "public-demo", "sim"),
        harness.server_doc("sim", "demo", sim_labels),
        harness.endpoints_doc("sim-engines", simulator_session.ports, sim_labels),
        harness.route_doc("echo", "echo-public", "echo"),
        harness.server_doc("echo", "echo-served", echo_labels,
                           annotations={"router.kthena.io/upstream-token-file": str(work / "token")}),
        harness.endpoints_doc("echo-engines", [echo_port], echo_labels),
    ]
    config = harness.write_config(work / "router.yaml", docs)
    with harness.start_router(config, work, workers=router_workers,
                              extra_args=["--max-body-bytes", str(MAX_BODY)]) as router:
        yield router


def _echo(router: harness.Router, body: dict | bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    with httpx.Client(timeout=60) as http:
        if isinstance(body, bytes):
            return http.post(f"{router.openai_url}/chat/completions", content=body,
                             headers={"content-type": "application/json", **(headers or {})})
        return http.post(f"{router.openai_url}/chat/completions", json=body, headers=headers)


def test_model_is_rewritten_to_the_servers_model(hdr_router: harness.Router, simulator: harness.Simulator) -> None:
    resp = hdr_router.openai().chat.completions.create(model="public-demo", messages=[{"role": "user", "content": "x"}],
                                                       max_tokens=2)
    assert resp.choices
    models = [e["model"] for i in range(len(simulator.ports)) for e in simulator.requests(i)["log"]]
    assert models == ["demo"]


def test_client_authorization_replaced_by_upstream_token(hdr_router: harness.Router) -> None:
    r = _echo(hdr_router, {"model": "echo-public", "messages": []},
              {"Authorization": "Bearer client-secret", "X-Custom": "v1", "Connection": "keep-alive",
               "Proxy-Authorization": "Basic abc"})
    assert r.status_code == 200, r.text
    seen = {k.lower(): v for k, v in r.json()["echo"]["headers"]}
    assert seen["authorization"] == f"Bearer {TOKEN}"
    assert "client-secret" not in json.dumps(r.json()["echo"])
    assert seen["x-custom"] == "v1"
    assert "proxy-authorization" not in seen
    assert seen["x-request-id"] == r.headers["x-request-id"]


def test_unchanged_fields_reach_the_engine_byte_for_byte(hdr_router: harness.Router) -> None:
    raw = b'{"model": "echo-public", "messages": [], "temperature": 0.70, "vendor_x": {"deep": [1, 2.50]}}'
    r = _echo(hdr_router, raw)
    assert r.status_code == 200, r.text
    forwarded = r.json()["echo"]["body"].encode()
    assert forwarded == raw.replace(b'"echo-public"', b'"echo-served"')


def test_engine_response_headers_pass_hop_by_hop_dropped(hdr_router: harness.Router) -> None:
    r = _echo(hdr_router, {"model": "echo-public", "messages": []})
    assert r.headers["x-engine-header"] == "kept"
    assert int(r.headers["content-length"]) == len(r.content)


def test_body_over_limit_is_413(hdr_router: harness.Router) -> None:
    big = {"model": "echo-public", "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
    r = _echo(hdr_router, big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"model": "echo-public", "messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY // 512 + 2):
            yield b"y" * 512
        yield b'"}]}'

    with httpx.Client(timeout=60) as http:
        r2 = http.post(f"{hdr_router.openai_url}/chat/completions", content=chunks(),
                       headers={"content-type": "application/json"})
    assert r2.status_code == 413


def test_sdk_sees_413_as_api_error(hdr_router: harness.Router) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        hdr_router.openai().chat.completions.create(
            model="echo-public", messages=[{"role": "user", "content": "z" * (MAX_BODY * 2)}])
    assert info.value.status_code == 413


def test_path_is_kept_for_other_v1_requests(hdr_router: harness.Router) -> None:
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{hdr_router.openai_url}/embeddings", json={"model": "echo-public", "input": "x"})
    assert r.status_code == 200, r.text
    assert r.json()["echo"]["path"] == "/v1/embeddings"
    assert json.loads(r.json()["echo"]["body"])["model"] == "echo-served"
