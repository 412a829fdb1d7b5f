"""The scheduler's decision in Rust (front/table.py with a router configuration).

Parity: two routers with configs/scheduling/prefix-cache.yaml (prefix-cache, least-request,
lora-affinity) over the same three echo engines, one deciding in the front (the default),
one asking Python for every completion (`--front-table off`). The same requests, one at a
time, each router's accounting settled before the next: the engine each request reached
must be the same for every request, so prefix matches, balanced misses, the Scorer's
ranking and its tie-break, and the in-flight counts and inserts the front feeds must all
equal Python's. The table router must have decided every one of them itself.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import pytest

TABLE = "kthena_router_front_table_decisions_total"
REPO = Path(__file__).resolve().parents[2]
PREFIX_CACHE = REPO / "configs" / "scheduling" / "prefix-cache.yaml"

PORT_ECHO_ENGINE = r'''
import asyncio, json, sys
from aiohttp import web

PORT = int(sys.argv[1])

async def complete(request):
    raw = await request.read()
    body = json.loads(raw)
    if body.get("max_tokens") == 99:  # held open: the test decides others meanwhile
        await asyncio.sleep(0.6)
    if body.get("stream") is True:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "e", "object": "chat.completion.chunk", "model": "m", "port": PORT,
                 "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
        usage = {"id": "e", "object": "chat.completion.chunk", "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: " + json.dumps(usage).encode()
                         + b"\n\ndata: [DONE]\n\n")
        return resp
    return web.json_response({"id": "e", "object": "chat.completion", "model": "m", "port": PORT,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}})

async def metrics(request):
    return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

async def health(request):
    return web.Response(text="ok")

app = web.Application()
app.router.add_get("/health", health)
app.router.add_get("/metrics", metrics)
app.router.add_post("/{tail:.*}", complete)
web.run_app(app, host="127.0.0.1", port=PORT, print=None)
'''


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Router, harness.Router, list[int]]]:
    work = tmp_path_factory.mktemp("front-table-sched")
    with harness.script_engine("echo-a", PORT_ECHO_ENGINE, work) as a, \
            harness.script_engine("echo-b", PORT_ECHO_ENGINE, work) as b, \
            harness.script_engine("echo-c", PORT_ECHO_ENGINE, work) as c:
        ports = [a, b, c]
        config = harness.write_config(work / "router.yaml", harness.engine_config(ports))
        common = ["--router-config", str(PREFIX_CACHE), "--health-probe-interval-s", "600"]
        table = harness.start_router(config, work / "table", extra_args=common)
        try:
            python = harness.start_router(config, work / "python", extra_args=[*common, "--front-table", "off"])
            try:
                yield table, python, ports
            finally:
                python.stop()
        finally:
            table.stop()


def _requests() -> list[tuple[str, dict]]:
    """Groups sharing long prefixes (chat system prompts, completion documents, token-id
    prompts), interleaved, plus misses; each with its own request id."""
    out: list[tuple[str, dict]] = []
    systems = [f"You are assistant {g}. " + f"Rules of group {g}: be brief. " * 12 for g in range(4)]
    docs = [f"Document {d}: " + "lorem ipsum dolor sit amet " * 20 for d in range(2)]
    for i in range(36):
        g = (i * 7) % 4
        kind = i % 6
        if kind in (0, 1, 2):
            body: dict = {"model": "demo", "max_tokens": 3, "stream": kind == 1, "messages": [
                {"role": "system", "content": systems[g]},
                {"role": "user", "content": [{"type": "text", "text": f"question {i}"}] if kind == 2 else f"q {i}"}]}
            out.append(("/chat/completions", body))
        elif kind == 3:
            out.append(("/completions", {"model": "demo", "max_tokens": 2, "prompt": docs[g % 2] + f" tail {i}"}))
        elif kind == 4:
            ids = list(range(100 * g, 100 * g + 40)) + [i]
            out.append(("/completions", {"model": "demo", "max_tokens": 2, "prompt": ids}))
        else:  # a miss: nothing shared with anything earlier
            out.append(("/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": f"alone {i} " * 30}]}))
    return out


def _send(router: harness.Router, path: str, body: dict, rid: str, n: int, active: int = 0) -> int:
    """The port of the engine that answered; returns once the router has accounted for it
    (its `n`-th request), so the next decision sees the same state on both routers."""
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{router.openai_url}{path}", json=body, headers={"x-request-id": rid})
    assert r.status_code == 200, r.text
    if body.get("stream"):
        first = next(line for line in r.text.splitlines() if line.startswith("data: "))
        port = json.loads(first[6:])["port"]
    else:
        port = r.json()["port"]

    def settled(m: dict) -> bool:
        return (harness.metric_value(m, "kthena_router_requests_total", model="demo") >= n
                and harness.metric_value(m, "kthena_router_active_downstream_requests", model="demo") == active)

    harness.metrics_when(router, settled)
    return int(port)


def _held(router: harness.Router, body: dict, rid: str) -> tuple[threading.Thread, list[int]]:
    """A request the engine holds open, started in a thread; returns once the router has
    it in flight (its Python side included)."""
    got: list[int] = []

    def run() -> None:
        with httpx.Client(timeout=30) as http:
            r = http.post(f"{router.openai_url}/chat/completions", json=body, headers={"x-request-id": rid})
        got.append(int(r.json()["port"]))

    t = threading.Thread(target=run)
    t.start()
    harness.metrics_when(router, lambda m: harness.metric_value(m, "kthena_router_active_upstream_requests") >= 1)
    return t, got


def test_the_front_schedules_as_python_does(routers: tuple[harness.Router, harness.Router, list[int]]) -> None:
    table, python, ports = routers
    before = harness.metric_value(harness.parse_metrics(table.metrics_text()), TABLE)
    reqs = _requests()
    got_t: list[int] = []
    got_p: list[int] = []
    n = 0
    for i, (path, body) in enumerate(reqs):
        rid = f"parity-{i}"
        if i % 6 == 5:
            # a held request of its own in flight while this one (a miss) is decided: the
            # in-flight count the front added at its decision steers least-request
            hold = {"model": "demo", "max_tokens": 99, "messages": [{"role": "user", "content": f"held {i} " * 20}]}
            for router, got in ((table, got_t), (python, got_p)):
                t, port = _held(router, hold, f"held-{i}")
                got.append(_send(router, path, body, rid, n + 1, active=1))
                t.join()
                got.append(port[0])
            n += 2
            harness.metrics_when(table, lambda m: harness.metric_value(m, "kthena_router_requests_total", model="demo") >= n)
            harness.metrics_when(python, lambda m: harness.metric_value(m, "kthena_router_requests_total", model="demo") >= n)
            continue
        n += 1
        got_t.append(_send(table, path, body, rid, n))
        got_p.append(_send(python, path, body, rid, n))
    assert got_t == got_p
    assert got_t[-2] != got_t[-1]  # the last miss went elsewhere than the held request
    # affinity did its job (the comparison is not between two random sequences)
    assert len(set(got_t)) > 1
    firsts: dict[str, int] = {}
    ports_of = [p for p in got_t]
    for i, (path, body) in enumerate(reqs):
        port = ports_of.pop(0)
        if i % 6 == 5:
            ports_of.pop(0)  # its held request
        elif path == "/chat/completions" and body["messages"][0]["role"] == "system":
            firsts.setdefault(body["messages"][0]["content"], port)
            assert port == firsts[body["messages"][0]["content"]]  # a group stays where its prefix is
    fams = harness.parse_metrics(table.metrics_text())
    assert harness.metric_value(fams, TABLE) == before + n
    py = harness.parse_metrics(python.metrics_text())
    assert harness.metric_value(py, TABLE) == 0
    # the scheduler's per-decision metrics come from the front's reports too
    for name, labels in (("kthena_router_scheduler_decisions_total", {}),
                         ("kthena_router_prefix_cache_match_ratio_count", {"model": "demo"})):
        assert harness.metric_value(fams, name, **labels) == harness.metric_value(py, name, **labels) > 0, name
