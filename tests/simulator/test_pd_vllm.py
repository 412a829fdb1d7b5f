"""vLLM NixlConnector-style prefill/decode on real simulator processes, over HTTP.

Engines: 0 prefill, 1 decode, 2 aggregated (no connector). The prefill's KV is kept
HOLD_S (simulated = wall seconds here) for its decode.
"""

from __future__ import annotations

import re
import socket

import httpx
import openai
import pytest

HOLD_S = 3.0
LONG = "the quick brown fox jumps over the lazy dog " * 400  # ~3.6k tokens
PARAMS = ("do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
          "remote_request_id", "remote_host", "remote_port", "tp_size")


@pytest.fixture(scope="module")
def sim(sim_factory):
    return sim_factory("--roles", "prefill,decode,both", "--kv-hold-timeout-s", str(HOLD_S),
                       "--seed", "5", engines=3)


@pytest.fixture(autouse=True)
def _clean(sim):
    sim.reset()
    yield
    # no test leaves KV held for the next one (at worst it expires)
    sim.wait_for(lambda: pd(sim, 0)["kv_held"] == 0, timeout=HOLD_S + 10, what="held KV gone")
    sim.reset()


def pd(sim, i):
    return sim.state(i)["pd"]


def client(sim, i):
    return openai.OpenAI(base_url=sim.url(i) + "/v1", api_key="x", max_retries=0)


def prefill(sim, prompt="hello there " * 40, **extra):
    """The prefill hop as a router sends it (vLLM's toy proxy): max_tokens 1, no stream."""
    r = client(sim, 0).completions.create(
        model="demo", prompt=prompt, max_tokens=1, extra_body={
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "remote_engine_id": None, "remote_block_ids": None,
                                   "remote_host": None, "remote_port": None}, **extra})
    return r, r.model_extra["kv_transfer_params"]


def decode_raw(sim, prompt, kv, i=1, **body):
    return httpx.post(sim.url(i) + "/v1/completions", timeout=30, json={
        "model": "demo", "prompt": prompt, "max_tokens": 4, "kv_transfer_params": kv, **body})


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metric(sim, i, name):
    text = httpx.get(sim.url(i) + "/metrics").text
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_prefill_reply_names_the_held_kv_and_decode_reads_it(sim):
    prompt = "hello there " * 40
    r, kv = prefill(sim, prompt)
    assert r.usage.completion_tokens == 1
    assert set(kv) == set(PARAMS)
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_host"] == "127.0.0.1" and kv["tp_size"] == 1
    engines = sim.admin.get("/admin/engines").json()
    assert kv["remote_port"] == engines[0]["kv_port"] != engines[0]["port"]
    assert [e["role"] for e in engines] == ["prefill", "decode", "both"]
    n_prompt = r.usage.prompt_tokens
    assert len(kv["remote_block_ids"]) == -(-n_prompt // 16)
    assert pd(sim, 0)["kv_held"] == 1 and pd(sim, 0)["prefill_requests"] == 1
    assert sim.state(0)["kv_usage"] > 0  # the blocks stay allocated while held

    out = client(sim, 1).completions.create(model="demo", prompt=prompt, max_tokens=6,
                                            extra_body={"kv_transfer_params": kv})
    assert out.usage.completion_tokens == 6 and out.usage.prompt_tokens == n_prompt
    p, d = pd(sim, 0), pd(sim, 1)
    assert p["kv_held"] == 0 and p["kv_sent"] == 1 and sim.state(0)["kv_usage"] == 0
    assert d["remote_prefill_decodes"] == 1 and d["kv_load_failures"] == 0
    want = len(kv["remote_block_ids"]) * 16 * 131_072
    assert p["kv_sent_bytes"] == d["kv_received_bytes"] == want
    assert d["kv_transfer_seconds"] == pytest.approx(want * 8 / 400e9)
    assert d["kv_wait_seconds"] >= d["kv_transfer_seconds"] * 0.9
    [entry] = sim.requests(1)["log"]
    assert entry["pd"]["hop"] == "decode" and entry["pd"]["kv_bytes"] == want
    # read once: the blocks are gone from the prefill engine
    again = decode_raw(sim, prompt, kv)
    assert again.status_code == 500


def test_streamed_decode_with_the_openai_sdk(sim):
    prompt = "a streamed one " * 30
    _, kv = prefill(sim, prompt)
    stream = client(sim, 1).completions.create(
        model="demo", prompt=prompt, max_tokens=5, stream=True,
        stream_options={"include_usage": True}, extra_body={"kv_transfer_params": kv})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert pd(sim, 1)["remote_prefill_decodes"] == 1 and pd(sim, 0)["kv_held"] == 0


def test_decode_does_not_recompute_the_prompt(sim):
    """TTFT in simulated engine time (/metrics): a plain long prompt pays its prefill on the
    decode engine, a remote-prefilled one only the last token."""
    name = "vllm:time_to_first_token_seconds_sum"
    t0 = metric(sim, 1, name)
    httpx.post(sim.url(1) + "/v1/completions", timeout=30,
               json={"model": "demo", "prompt": LONG, "max_tokens": 1}).raise_for_status()
    t1 = metric(sim, 1, name)
    other = LONG.replace("fox", "cat")  # not in the decode engine's prefix cache
    _, kv = prefill(sim, other)
    decode_raw(sim, other, kv, max_tokens=1).raise_for_status()
    t2 = metric(sim, 1, name)
    local, remote = t1 - t0, t2 - t1
    assert local > 0.05  # ~3.6k tokens of prefill
    assert remote < local / 4


@pytest.mark.parametrize("case", ["missing", "wrong_port", "wrong_engine", "wrong_blocks"])
def test_bad_params_fail_as_vllm_does(sim, case):
    prompt = "bad params " * 20
    _, kv = prefill(sim, prompt)
    bad = dict(kv)
    if case == "missing":
        del bad["remote_request_id"]
        del bad["remote_host"]
    elif case == "wrong_port":
        bad["remote_port"] = closed_port()
    elif case == "wrong_engine":
        bad["remote_engine_id"] = "not-this-engine"
    else:
        bad["remote_block_ids"] = [b + 1 for b in bad["remote_block_ids"]]
    r = decode_raw(sim, prompt, bad)
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "Internal server error",
                                  "type": "InternalServerError", "param": None, "code": 500}}
    d = pd(sim, 1)
    assert d["kv_load_failures"] == 1 and d["remote_prefill_decodes"] == 0
    [entry] = sim.requests(1)["log"]
    assert entry["status"] == "errored" and entry["pd"]["error"]
    if case == "missing":
        assert "remote_request_id" in entry["pd"]["error"]
    assert "KV load failed" in sim.stderr()
    # the prefill engine still holds the KV (nothing read it); the right params still work
    assert pd(sim, 0)["kv_held"] == 1
    assert decode_raw(sim, prompt, kv).status_code == 200


def test_streamed_decode_failure_ends_the_stream_with_an_error_event(sim):
    prompt = "stream failure " * 10
    _, kv = prefill(sim, prompt)
    with httpx.stream("POST", sim.url(1) + "/v1/completions", timeout=30, json={
            "model": "demo", "prompt": prompt, "max_tokens": 4, "stream": True,
            "kv_transfer_params": {**kv, "remote_port": closed_port()}}) as r:
        assert r.status_code == 200  # vLLM answers before the engine runs
        body = r.read().decode()
    events = [e for e in body.split("\n\n") if e]
    assert events == ['data: {"error":{"message":"Internal server error","type":'
                      '"InternalServerError","param":null,"code":500}}', "data: [DONE]"]
    assert sim.requests(1)["errored"] == 1
    assert decode_raw(sim, prompt, kv).status_code == 200  # the KV was still there


def test_unread_kv_expires_and_then_the_read_fails(sim):
    prompt = "expiring " * 30
    _, kv = prefill(sim, prompt)
    assert pd(sim, 0)["kv_held"] == 1
    sim.wait_for(lambda: pd(sim, 0)["kv_expired"] == 1, timeout=HOLD_S + 10, what="expiry")
    assert pd(sim, 0)["kv_held"] == 0 and sim.state(0)["kv_usage"] == 0
    r = decode_raw(sim, prompt, kv)
    assert r.status_code == 500
    [entry] = sim.requests(1)["log"]
    assert "expired" in entry["pd"]["error"]


def test_http_connector_prefill_is_an_ordinary_one_token_request(sim):
    """Kthena's http/lmcache connector: max_tokens 1 without kv_transfer_params."""
    r = httpx.post(sim.url(0) + "/v1/completions", json={
        "model": "demo", "prompt": "plain prefill " * 10, "max_tokens": 1}).json()
    assert r["usage"]["completion_tokens"] == 1 and r["kv_transfer_params"] is None
    assert pd(sim, 0)["kv_held"] == 0 and pd(sim, 0)["prefill_requests"] == 0


def test_aggregated_engine_ignores_kv_transfer_params(sim):
    r = httpx.post(sim.url(2) + "/v1/completions", json={
        "model": "demo", "prompt": "agg " * 10, "max_tokens": 2,
        "kv_transfer_params": {"do_remote_decode": True}}).json()
    assert r["kv_transfer_params"] is None and r["usage"]["completion_tokens"] == 2
    assert sim.state(2)["pd"] is None and sim.state(2)["kv_usage"] == 0


def test_client_disconnect_during_the_prefill_hop(sim):
    with httpx.stream("POST", sim.url(0) + "/v1/completions", timeout=30, headers={
            "X-Request-ID": "p-gone"}, json={
            "model": "demo", "prompt": "long prefill hop " * 10, "max_tokens": 5000,
            "stream": True, "kv_transfer_params": {"do_remote_decode": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one token, then the client goes away
    sim.wait_for(lambda: pd(sim, 0)["aborted_prefill"] == 1, what="prefill abort")
    [entry] = sim.requests(0)["log"]
    assert entry["status"] == "aborted" and entry["pd"] == {"hop": "prefill", "aborted": True}
    assert pd(sim, 0)["kv_held"] == 0
    sim.wait_for(lambda: sim.state(0)["kv_usage"] == 0, what="blocks freed")
    assert "prefill hop aborted by the client (request_id=p-gone)" in sim.stderr()


def test_client_disconnect_during_the_decode_hop(sim):
    prompt = "long decode hop " * 10
    _, kv = prefill(sim, prompt)
    with httpx.stream("POST", sim.url(1) + "/v1/completions", timeout=30, headers={
            "X-Request-ID": "d-gone"}, json={
            "model": "demo", "prompt": prompt, "max_tokens": 5000, "stream": True,
            "kv_transfer_params": kv}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
    sim.wait_for(lambda: pd(sim, 1)["aborted_decode"] == 1, what="decode abort")
    [entry] = sim.requests(1)["log"]
    assert entry["status"] == "aborted" and entry["pd"]["aborted"] is True
    assert "decode hop aborted by the client (request_id=d-gone)" in sim.stderr()
    assert pd(sim, 1)["aborted_prefill"] == 0 and pd(sim, 0)["aborted_prefill"] == 0


def test_fast_mode_speaks_pd_and_recompute_policy(sim_factory):
    s = sim_factory("--fast", "--roles", "prefill,decode", "--kv-load-failure-policy",
                    "recompute", engines=2)
    r = httpx.post(s.url(0) + "/v1/completions", json={
        "model": "demo", "prompt": "fast " * 50, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}}).json()
    kv = r["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["remote_block_ids"]
    ok = httpx.post(s.url(1) + "/v1/completions", json={
        "model": "demo", "prompt": "fast " * 50, "max_tokens": 3, "kv_transfer_params": kv})
    assert ok.status_code == 200 and s.state(1)["pd"]["remote_prefill_decodes"] == 1
    # policy recompute: a failed read is prefilled locally, the request succeeds
    bad = httpx.post(s.url(1) + "/v1/completions", json={
        "model": "demo", "prompt": "fast " * 50, "max_tokens": 3, "kv_transfer_params": kv})
    assert bad.status_code == 200 and bad.json()["usage"]["completion_tokens"] == 3
    d = s.state(1)["pd"]
    assert d["kv_load_failures"] == 1 and d["kv_recomputed"] == 1


def test_pd_flags_are_validated():
    from loadtest.simulator.__main__ import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--engines", "2", "--roles", "prefill"])
    with pytest.raises(SystemExit):
        parse_args(["--engines", "1", "--roles", "middle"])
    with pytest.raises(SystemExit):
        parse_args(["--flavour", "sglang", "--kv-load-failure-policy", "recompute"])
    with pytest.raises(SystemExit):
        parse_args(["--kv-bandwidth-gbps", "0"])
    a = parse_args(["--engines", "2", "--roles", "prefill,decode", "--kv-ports", "0,5601"])
    assert a.role_list == ["prefill", "decode"] and a.kv_port_list == [0, 5601]
