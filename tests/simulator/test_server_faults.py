"""Failure knobs, request accounting and client-disconnect detection, on real processes."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import httpx
import openai
import orjson
import pytest

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def sim(sim_factory):
    # the physics engine (time_scale 1): long generations take long enough to cut off
    return sim_factory("--seed", "3", engines=2)


@pytest.fixture(autouse=True)
def _clean(sim):
    sim.reset()
    yield
    sim.reset()


def entry(sim, rid, i=0):
    for e in sim.requests(i)["log"]:
        if e["request_id"] == rid:
            return e
    return None


def wait_status(sim, rid, status, i=0):
    return sim.wait_for(lambda: (e := entry(sim, rid, i)) and e["status"] == status and e,
                        what=f"{rid} -> {status}: {entry(sim, rid, i)}")


def test_error_rate_all_and_custom_status(sim):
    sim.faults(0, error_rate=1.0, error_status=503)
    r = httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "e1"})
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == 503 and err["message"]
    e = entry(sim, "e1")
    assert e["status"] == "errored" and e["fault"] == "error" and e["tokens_out"] == 0
    assert sim.requests(0)["errored"] == 1
    # the other engine is untouched
    assert httpx.post(sim.url(1) + "/v1/chat/completions", json=CHAT).status_code == 200
    sim.faults(0, error_status=429)  # a 4xx from the fault is still counted as errored
    r = httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "e2"})
    assert r.status_code == 429 and entry(sim, "e2")["status"] == "errored"


def test_error_rate_fraction(sim_factory):
    s = sim_factory("--fast", "--seed", "11")
    s.faults(0, error_rate=0.5)
    codes = [httpx.post(s.url(0) + "/v1/completions",
                        json={"model": "demo", "prompt": "x", "max_tokens": 1}).status_code
             for _ in range(200)]
    n_err = codes.count(500)
    assert n_err + codes.count(200) == 200
    assert 60 <= n_err <= 140  # binomial(200, 0.5): outside is a ~1e-8 event
    assert s.requests(0)["errored"] == n_err


def test_faults_are_validated(sim):
    for bad in ({"error_rate": 2}, {"nope": 1}, {"stall": "yes"}, {"error_status": 200},
                {"stall_after_tokens": -1}, {"token_delay_s": -1},
                {"die_after_tokens": -1}):
        r = sim.admin.post("/admin/engines/0/faults", json=bad)
        assert r.status_code == 400, bad
        assert r.json()["error"]["message"]
    assert sim.admin.get("/admin/engines/0/faults").json()["error_rate"] == 0.0
    assert sim.admin.get("/admin/engines/9/faults").status_code == 404


def test_refuse_connections_and_reopen(sim):
    with httpx.Client(base_url=sim.url(0), timeout=10) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # keep-alive open
        sim.faults(0, refuse_connections=True)
        with pytest.raises(httpx.TransportError):  # pooled connection gets reset
            c.post("/v1/chat/completions", json=CHAT)
    with pytest.raises(httpx.ConnectError):
        httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT, timeout=10)
    assert sim.admin.get("/admin/engines").json()[0]["listening"] is False
    sim.faults(0, refuse_connections=False)
    assert httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT).status_code == 200
    # refused attempts never reach the engine's accounting
    assert sim.requests(0)["received"] == 2


@pytest.mark.parametrize("n", [0, 3])
def test_die_after_tokens_streaming(sim, n):
    sim.faults(0, die_after_tokens=n)
    rid = f"die-s-{n}"
    chunks = []
    with pytest.raises(httpx.TransportError):
        with httpx.stream("POST", sim.url(0) + "/v1/chat/completions",
                          json={**CHAT, "stream": True, "max_tokens": 50},
                          headers={"X-Request-ID": rid}, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(orjson.loads(line[6:]))
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == n
    e = wait_status(sim, rid, "died")
    assert e["fault"] == "die" and e["tokens_out"] == n
    sim.wait_for(lambda: sim.state(0)["running"] == 0, what="engine freed the sequence")


def test_die_after_tokens_non_streaming_and_sdk(sim):
    sim.faults(0, die_after_tokens=2)
    with pytest.raises(httpx.TransportError):
        httpx.post(sim.url(0) + "/v1/completions", headers={"X-Request-ID": "die-u"},
                   json={"model": "demo", "prompt": "x", "max_tokens": 20}, timeout=30)
    assert wait_status(sim, "die-u", "died")["tokens_out"] == 2
    with openai.OpenAI(base_url=sim.url(0) + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.APIError):
            list(c.chat.completions.create(**{**CHAT, "max_tokens": 30}, stream=True))


def test_garbage_output(sim):
    sim.faults(0, garbage=True)
    r = httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "g1"})
    assert r.status_code == 200
    with pytest.raises(ValueError):
        orjson.loads(r.content)
    with httpx.stream("POST", sim.url(0) + "/v1/chat/completions", json={**CHAT, "stream": True},
                      timeout=30) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln]
    assert "data: [DONE]" not in lines
    bad = 0
    for ln in lines:
        try:
            orjson.loads(ln.removeprefix("data: "))
        except ValueError:
            bad += 1
    assert bad == len(lines) >= 2
    e = entry(sim, "g1")
    assert e["status"] == "errored" and e["fault"] == "garbage"
    with openai.OpenAI(base_url=sim.url(0) + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises((openai.APIError, ValueError)):
            list(c.chat.completions.create(**CHAT, stream=True))


def test_first_byte_delay(sim):
    sim.faults(0, first_byte_delay_s=0.4)
    t0 = time.monotonic()
    r = httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "d1"},
                   timeout=30)
    assert r.status_code == 200
    assert time.monotonic() - t0 >= 0.4  # a lower bound holds on any machine
    e = entry(sim, "d1")
    assert e["status"] == "completed" and e["fault"] == "first_byte_delay"


@pytest.mark.parametrize("n", [0, 2])
def test_stall_after_tokens_keeps_the_connection_silent(sim, n):
    sim.faults(0, stall_after_tokens=n)
    rid = f"sat-{n}"
    chunks = []
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", sim.url(0) + "/v1/chat/completions",
                          json={**CHAT, "stream": True, "max_tokens": 20},
                          headers={"X-Request-ID": rid}, timeout=httpx.Timeout(30, read=1.0)) as r:
            assert r.status_code == 200  # the head came (for n = 0 with no event after it)
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(orjson.loads(line[6:]))
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == n
    e = entry(sim, rid)
    assert e["fault"] == "stall_after_tokens" and e["tokens_out"] == n
    wait_status(sim, rid, "aborted")  # the client went away


def test_token_delay_slows_every_token(sim):
    sim.faults(0, token_delay_s=0.1)
    t0 = time.monotonic()
    with httpx.stream("POST", sim.url(0) + "/v1/chat/completions",
                      json={**CHAT, "stream": True, "max_tokens": 5}, timeout=30) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert time.monotonic() - t0 >= 0.5  # a lower bound holds on any machine
    r = httpx.post(sim.url(0) + "/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 3},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_slow_start_at_runtime(sim):
    sim.faults(1, slow_start_s=1.0)
    assert httpx.get(sim.url(1) + "/health").status_code == 503
    r = httpx.post(sim.url(1) + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.json()["error"]["code"] == 503
    assert sim.requests(1)["errored"] == 1
    sim.wait_for(lambda: httpx.get(sim.url(1) + "/health").status_code == 200, what="healthy")
    assert httpx.post(sim.url(1) + "/v1/chat/completions", json=CHAT).status_code == 200


def test_faults_from_the_command_line(sim_factory):
    s = sim_factory("--fast", "--faults",
                    '{"*": {"slow_start_s": 600}, "1": {"slow_start_s": 0, "error_rate": 1}}',
                    engines=2)
    assert httpx.get(s.url(0) + "/health").status_code == 503
    assert httpx.get(s.url(1) + "/health").status_code == 200
    assert httpx.post(s.url(1) + "/v1/chat/completions", json=CHAT).status_code == 500
    assert s.admin.get("/admin/engines/0/faults").json()["slow_start_remaining_s"] > 0
    s.admin.post("/admin/engines/0/faults/reset")
    assert httpx.get(s.url(0) + "/health").status_code == 200


def test_bad_fault_spec_fails_at_start(sim_factory):
    with pytest.raises(RuntimeError, match="faults"):
        sim_factory("--fast", "--faults", '{"5": {"stall": true}}')


async def test_stalled_request_then_client_gives_up(sim):
    sim.faults(0, stall=True)
    async with httpx.AsyncClient(timeout=60) as c:
        task = asyncio.create_task(c.post(sim.url(0) + "/v1/chat/completions", json=CHAT,
                                          headers={"X-Request-ID": "st1"}))
        e = await asyncio.to_thread(wait_status, sim, "st1", "stalled")
        assert e["fault"] == "stall" and sim.requests(0)["stalled"] == 1
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    e = await asyncio.to_thread(wait_status, sim, "st1", "aborted")
    assert e["fault"] == "stall"


async def test_abort_detected_streaming(sim):
    async with httpx.AsyncClient(timeout=60) as c:
        async with c.stream("POST", sim.url(0) + "/v1/chat/completions",
                            json={**CHAT, "stream": True, "max_tokens": 100000},
                            headers={"X-Request-ID": "ab-s"}) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= 3:
                    break
        # leaving the block closes the connection mid-stream
    e = await asyncio.to_thread(wait_status, sim, "ab-s", "aborted")
    assert 0 < e["tokens_out"] < 100000
    st = await asyncio.to_thread(sim.wait_for, lambda: (s := sim.state(0))["running"] == 0 and s)
    assert st["kv_usage"] == 0.0  # the engine freed the aborted sequence's blocks


async def test_abort_detected_non_streaming(sim):
    async with httpx.AsyncClient(timeout=60) as c:
        task = asyncio.create_task(c.post(sim.url(0) + "/v1/completions",
                                          json={"model": "demo", "prompt": "x",
                                                "max_tokens": 100000},
                                          headers={"X-Request-ID": "ab-u"}))
        await asyncio.to_thread(sim.wait_for, lambda: (e := entry(sim, "ab-u")) and
                                e["tokens_out"] > 0, what="generation started")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.to_thread(wait_status, sim, "ab-u", "aborted")
    await asyncio.to_thread(sim.wait_for, lambda: sim.state(0)["running"] == 0,
                            what="engine freed the sequence")
    counts = sim.requests(0)
    assert counts["aborted"] == 1 and counts["running"] == 0


def test_requests_reset(sim):
    httpx.post(sim.url(0) + "/v1/chat/completions", json=CHAT)
    assert sim.requests(0)["received"] == 1
    sim.admin.post("/admin/engines/0/requests/reset")
    got = sim.requests(0)
    assert got["received"] == 0 and got["log"] == [] and got["completed"] == 0


def test_streams_cut_by_the_client_end_quietly(sim_factory):
    """A router cancelling upstream work closes the engine connection mid-stream: the
    simulator records the abort and logs no traceback (aiohttp's "Error handling request")."""
    s = sim_factory("--fast", "--seed", "5")
    host, port = s.url(0).removeprefix("http://").split(":")
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 2000})
    for i in range(30):
        conn = socket.create_connection((host, int(port)))
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"X-Request-ID: cut-%d\r\nContent-Length: %d\r\n\r\n" % (i, len(body)) + body)
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, as a cancel
        conn.close()
    for i in range(30):
        wait_status(s, f"cut-{i}", "aborted")
    assert "Error handling request" not in s.stderr()
    assert "Traceback" not in s.stderr()
