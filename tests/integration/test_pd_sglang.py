"""Prefill/decode dispatch against SGLang-flavoured simulator engines (bootstrap rooms):
both hops at once, tied by bootstrap_host / bootstrap_port / bootstrap_room.

Engines: 0 prefill (group a), 1 decode (a), 2 prefill (b), 3 decode (b). The prefill
engines' bootstrap servers listen on free ports, read from the simulator's admin API and
written into the Endpoints document (`bootstrapPort`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import openai
import pd_harness as pdh
import pytest

MSGS = [{"role": "user", "content": "hello there, tell me a story"}]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    with harness.start_simulator(tmp_path_factory.mktemp("pd-sg-sim"), engines=4, flavour="sglang", extra_args=[
         "--roles", "prefill,decode,prefill,decode", "--kv-hold-timeout-s", "20", "--kv-wait-timeout-s", "20"]) as s:
        yield s


@pytest.fixture(scope="module")
def router(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work: Path = tmp_path_factory.mktemp("pd-sg-router")
    p = sim.ports
    boot = {e["index"]: e["kv_port"] for e in sim.engines()}
    assert boot[0] and boot[2] and boot[0] != boot[2]
    docs = [
        harness.route_doc("pd-sg", "pd-sg", "pd-sg"),
        pdh.pd_server("pd-sg", {"app": "sg"}, engine="SGLang"),
        harness.route_doc("pd-sg-single", "pd-sg-single", "pd-sg-single"),
        pdh.pd_server("pd-sg-single", {"app": "sg", "group": "a"}, engine="SGLang"),
        pdh.endpoints("sg-engines", [
            (p[0], {"app": "sg", "group": "a", "role": "prefill"}, boot[0]),
            (p[1], {"app": "sg", "group": "a", "role": "decode"}, None),
            (p[2], {"app": "sg", "group": "b", "role": "prefill"}, boot[2]),
            (p[3], {"app": "sg", "group": "b", "role": "decode"}, None)]),
    ]
    config = harness.write_config(work / "router.yaml", docs)
    with harness.start_router(config, work, workers=1, extra_args=["--health-probe-interval-s", "0.3"]) as r:
        yield r


@pytest.fixture(autouse=True)
def _clean(sim: harness.Simulator) -> Iterator[None]:
    sim.reset_faults()
    sim.reset_requests()
    yield
    sim.reset_faults()


def _client(router: harness.Router) -> openai.OpenAI:
    return router.openai(max_retries=0, timeout=60)


@pytest.mark.parametrize("stream", [False, True])
def test_bootstrap_pair_serves(router: harness.Router, sim: harness.Simulator, stream: bool) -> None:
    rid = uuid.uuid4().hex
    client = _client(router)
    if stream:
        chunks = list(client.chat.completions.create(model="pd-sg", messages=MSGS, max_tokens=6, stream=True,
                                                     extra_headers={"X-Request-ID": rid}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        r = client.chat.completions.create(model="pd-sg", messages=MSGS, max_tokens=6,
                                           extra_headers={"X-Request-ID": rid})
        text = r.choices[0].message.content
        assert r.usage.completion_tokens == 6
    assert text
    seen = pdh.hops(sim, rid)
    (p_idx, (p,)), (d_idx, (d,)) = sorted(seen.items())
    assert (p_idx, d_idx) in ((0, 1), (2, 3)), seen
    assert p["pd"]["hop"] == "prefill" and d["pd"]["hop"] == "decode"
    assert p["pd"]["bootstrap_room"] == d["pd"]["bootstrap_room"]  # one room per pair
    assert p["stream"] is False and d["stream"] is stream
    assert d["pd"]["kv_tokens"] > 0 and d["tokens_out"] == 6
    assert pdh.metric(router, "kthena_router_pd_requests_total", model_server="default/pd-sg", mode="two_hop") >= 1


def test_prefill_down_moves_to_the_next_pair(router: harness.Router, sim: harness.Simulator) -> None:
    sim.set_faults(0, error_rate=1.0, error_status=500)
    client = _client(router)
    for _ in range(4):
        r = client.chat.completions.create(model="pd-sg", messages=MSGS, max_tokens=3)
        assert r.choices[0].message.content
    assert sim.requests(3)["completed"] == 4


def test_prefill_down_cancels_its_decode(router: harness.Router, sim: harness.Simulator) -> None:
    # the decode would wait for KV that never comes (kv-wait-timeout 20 s): it is cancelled
    sim.set_faults(0, error_rate=1.0, error_status=500)
    rid = uuid.uuid4().hex
    with pytest.raises(openai.APIStatusError) as ei:
        _client(router).chat.completions.create(model="pd-sg-single", messages=MSGS, max_tokens=3,
                                                extra_headers={"X-Request-ID": rid})
    assert ei.value.status_code == 502 and "prefill hop" in ei.value.body["message"], ei.value.body
    pdh.wait_entry(sim, 1, rid, ("aborted",), timeout=10)
    assert pdh.pd_state(sim, 1)["aborted_decode"] == 1


def test_decode_failure_cancels_the_prefill(router: harness.Router, sim: harness.Simulator) -> None:
    sim.set_faults(1, error_rate=1.0, error_status=500)
    rid = uuid.uuid4().hex
    with pytest.raises(openai.APIStatusError) as ei:
        _client(router).chat.completions.create(model="pd-sg-single", messages=MSGS, max_tokens=3, stream=True,
                                                extra_headers={"X-Request-ID": rid})
    assert ei.value.status_code == 502 and "decode hop" in ei.value.body["message"], ei.value.body
    # the prefill was waiting for its decode to bootstrap (hold timeout 20 s): cancelled at once
    pdh.wait_entry(sim, 0, rid, ("aborted",), timeout=10)
    assert pdh.pd_state(sim, 0)["aborted_prefill"] == 1


def test_decode_dying_mid_stream_ends_with_an_error_event(router: harness.Router, sim: harness.Simulator) -> None:
    for i in (1, 3):
        sim.set_faults(i, die_after_tokens=3)
    with httpx.Client(timeout=60) as http:
        lines = pdh.sse_lines(router, http, "pd-sg", uuid.uuid4().hex, max_tokens=50)
    assert lines[-1].startswith('data: {"error"'), lines[-3:]
    assert "data: [DONE]" not in lines


def test_disconnect_cancels_both_hops(router: harness.Router, sim: harness.Simulator) -> None:
    sim.set_faults(0, token_delay_s=5.0)  # the prefill is slow: the decode waits in the room
    rid = uuid.uuid4().hex
    body = {"model": "pd-sg-single", "messages": MSGS, "max_tokens": 5}
    with httpx.Client(timeout=httpx.Timeout(60, read=1.0)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{router.openai_url}/chat/completions", json=body, headers={"X-Request-ID": rid})
    pdh.wait_entry(sim, 0, rid, ("aborted",))
    pdh.wait_entry(sim, 1, rid, ("aborted",))
    assert pdh.pd_state(sim, 0)["aborted_prefill"] == 1 and pdh.pd_state(sim, 1)["aborted_decode"] == 1
