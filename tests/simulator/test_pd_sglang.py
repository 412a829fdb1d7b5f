"""SGLang bootstrap-room prefill/decode on a real simulator process, over HTTP.

Engine 0 is a prefill (its bootstrap server on a free port), engine 1 a decode. Both hops
of a request are sent at once, as SGLang's router does. Timeouts are short (TIMEOUT_S).
"""

from __future__ import annotations

import random
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

TIMEOUT_S = 2.0
MSG = [{"role": "user", "content": "tell me about bootstrap rooms " * 20}]


@pytest.fixture(scope="module")
def sim(sim_factory):
    return sim_factory("--flavour", "sglang", "--roles", "prefill,decode", "--kv-hold-timeout-s",
                       str(TIMEOUT_S), "--kv-wait-timeout-s", str(TIMEOUT_S), engines=2)


@pytest.fixture(autouse=True)
def _clean(sim):
    sim.reset()
    yield
    sim.wait_for(lambda: sim.state(0)["pd"]["kv_held"] == 0, timeout=TIMEOUT_S + 10,
                 what="prefill rooms gone")
    sim.reset()


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(4) as ex:
        yield ex


def pd(sim, i):
    return sim.state(i)["pd"]


def boot(sim, room=None):
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": sim.state(0)["pd"]["kv_port"],
            "bootstrap_room": random.getrandbits(63) if room is None else room}


def post(sim, i, body, timeout=30.0, **kw):
    return httpx.post(sim.url(i) + "/v1/chat/completions", timeout=timeout,
                      json={"model": "demo", "messages": MSG, "max_tokens": 6, **body}, **kw)


def test_both_hops_at_once(sim, pool):
    b = boot(sim)
    fp = pool.submit(post, sim, 0, b)
    fd = pool.submit(post, sim, 1, b)
    rp, rd = fp.result(), fd.result()
    assert rp.status_code == 200 and rd.status_code == 200
    assert rp.json()["usage"]["completion_tokens"] == 1  # prefill mode stops after the prefill
    assert rd.json()["usage"]["completion_tokens"] == 6
    p, d = pd(sim, 0), pd(sim, 1)
    assert p["prefill_requests"] == 1 and p["kv_sent"] == 1 and p["kv_held"] == 0
    assert d["remote_prefill_decodes"] == 1
    n = rd.json()["usage"]["prompt_tokens"]
    assert p["kv_sent_bytes"] == d["kv_received_bytes"] == -(-n // 16) * 16 * 131_072
    assert sim.state(0)["kv_usage"] == 0  # pushed, then freed
    info = httpx.get(sim.url(0) + "/get_server_info").json()
    assert info["disaggregation_mode"] == "prefill"
    assert info["disaggregation_bootstrap_port"] == pd(sim, 0)["kv_port"]
    assert httpx.get(f"http://127.0.0.1:{pd(sim, 0)['kv_port']}/health").text == "OK"


def test_decode_first_then_prefill_streamed_with_the_openai_sdk(sim, pool):
    b = boot(sim)
    dec = openai.OpenAI(base_url=sim.url(1) + "/v1", api_key="x", max_retries=0)

    def decode():
        s = dec.chat.completions.create(model="demo", messages=MSG, max_tokens=4, stream=True,
                                        extra_body=b)
        return [c.choices[0].delta.content for c in s if c.choices]

    fd = pool.submit(decode)
    sim.wait_for(lambda: sim.requests(1)["running"] == 1, what="decode waiting in its room")
    assert post(sim, 0, b).status_code == 200
    assert "".join(x or "" for x in fd.result())
    assert pd(sim, 1)["remote_prefill_decodes"] == 1
    assert pd(sim, 1)["kv_wait_seconds"] > pd(sim, 1)["kv_transfer_seconds"]


def test_wrong_bootstrap_port_fails_the_decode_as_sglang_does(sim):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    b = {**boot(sim), "bootstrap_port": closed}
    r = post(sim, 1, b, headers={"X-Request-ID": "rid-1"})
    assert r.status_code == 500
    body = r.json()
    room = b["bootstrap_room"]
    assert body == {"object": "error", "type": "500", "param": None, "code": 500, "message": (
        f"Decode transfer failed for request rank=0 decode_req.req.rid='rid-1' "
        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room="
        f"{room}): Failed to get kvcache from prefill instance, it might be dead")}
    assert pd(sim, 1)["kv_load_failures"] == 1


def test_missing_bootstrap_fields(sim):
    r = post(sim, 0, {})
    assert r.status_code == 400
    assert r.json()["message"].startswith("bootstrap_room is required in PREFILL mode")
    r = post(sim, 1, {"bootstrap_room": 5})  # no host/port: the decode cannot bootstrap
    assert r.status_code == 500 and "KVTransferError(bootstrap_room=5)" in r.json()["message"]


def test_unpaired_hops_time_out(sim, pool):
    fp = pool.submit(post, sim, 0, boot(sim))  # a prefill whose decode never comes
    b = boot(sim)
    rd = post(sim, 1, b)  # a decode whose prefill never comes
    rp = fp.result()
    assert rp.status_code == 500 and "in KVPoll.Bootstrapping" in rp.json()["message"]
    assert rp.json()["message"].startswith("Prefill transfer failed for request rank=0")
    assert rd.status_code == 500
    assert f"Request {b['bootstrap_room']} timed out after {TIMEOUT_S:.1f}s in " \
           "KVPoll.WaitingForInput" in rd.json()["message"]
    assert pd(sim, 0)["kv_expired"] == 1 and pd(sim, 0)["kv_held"] == 0
    assert sim.state(0)["kv_usage"] == 0


def test_client_disconnect_during_the_prefill_hop_fails_its_decode(sim, pool):
    b = boot(sim)
    with pytest.raises(httpx.ReadTimeout):  # the prefill waits for its decode; client leaves
        post(sim, 0, b, headers={"X-Request-ID": "p-gone"},
             timeout=httpx.Timeout(30, read=TIMEOUT_S / 4))
    sim.wait_for(lambda: pd(sim, 0)["aborted_prefill"] == 1, what="prefill abort")
    assert pd(sim, 0)["kv_held"] == 0
    assert "prefill hop aborted by the client (request_id=p-gone)" in sim.stderr()
    rd = post(sim, 1, b)
    assert rd.status_code == 500 and rd.json()["message"].endswith(
        f"KVTransferError(bootstrap_room={b['bootstrap_room']}): Aborted by AbortReq.")


def test_client_disconnect_during_the_decode_hop_fails_its_prefill(sim):
    b = boot(sim)
    with pytest.raises(httpx.ReadTimeout):  # the decode waits in its room; client leaves
        post(sim, 1, b, headers={"X-Request-ID": "d-gone"},
             timeout=httpx.Timeout(30, read=TIMEOUT_S / 4))
    sim.wait_for(lambda: pd(sim, 1)["aborted_decode"] == 1, what="decode abort")
    [entry] = sim.requests(1)["log"]
    assert entry["status"] == "aborted" and entry["pd"]["aborted"] is True
    assert "decode hop aborted by the client (request_id=d-gone)" in sim.stderr()
    rp = post(sim, 0, b)
    assert rp.status_code == 500 and "Decode instance could be dead" in rp.json()["message"]
