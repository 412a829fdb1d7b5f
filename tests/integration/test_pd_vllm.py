"""Prefill/decode dispatch against vLLM-flavoured simulator engines (http, lmcache, nixl,
mooncake connectors), through the real router and the OpenAI SDK.

Engines: 0 prefill (group a), 1 decode (a), 2 prefill (b), 3 decode (b), 4 aggregated
(no KV connector: its replies carry `kv_transfer_params: null`). A prefill keeps its KV
HOLD_S for its decode.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import openai
import pd_harness as pdh
import pytest

HOLD_S = 2.0
MSGS = [{"role": "user", "content": "hello there, tell me a story"}]
CONNECTORS = ("http", "lmcache", "nixl", "mooncake")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    with harness.start_simulator(tmp_path_factory.mktemp("pd-sim"), engines=5, extra_args=[
         "--roles", "prefill,decode,prefill,decode,both", "--kv-hold-timeout-s", str(HOLD_S)]) as s:
        yield s


def _config(sim: harness.Simulator) -> list[dict]:
    p = sim.ports
    docs: list[dict] = []
    for c in CONNECTORS:
        docs += [harness.route_doc(f"pd-{c}", f"pd-{c}", f"pd-{c}"),
                 pdh.pd_server(f"pd-{c}", {"app": "pd"}, connector=c)]
    docs += [
        harness.route_doc("pd-single", "pd-single", "pd-single"),
        pdh.pd_server("pd-single", {"app": "pd", "group": "a"}, connector="nixl"),
        harness.route_doc("pd-noprefill", "pd-noprefill", "pd-noprefill"),
        pdh.pd_server("pd-noprefill", {"app": "pd", "role": "decode"}),
        harness.route_doc("pd-fake", "pd-fake", "pd-fake"),
        pdh.pd_server("pd-fake", {"app": "fake"}, connector="nixl"),
        pdh.endpoints("pd-engines", [
            (p[0], {"app": "pd", "group": "a", "role": "prefill"}, None),
            (p[1], {"app": "pd", "group": "a", "role": "decode"}, None),
            (p[2], {"app": "pd", "group": "b", "role": "prefill"}, None),
            (p[3], {"app": "pd", "group": "b", "role": "decode"}, None)]),
        pdh.endpoints("fake-engines", [
            (p[4], {"app": "fake", "group": "x", "role": "prefill"}, None),
            (p[1], {"app": "fake", "group": "x", "role": "decode"}, None)]),
    ]
    rl = harness.route_doc("pd-rl", "pd-rl", "pd-nixl")
    rl["spec"]["rateLimit"] = {"inputTokensPerUnit": 1000000, "outputTokensPerUnit": 1000000, "unit": "hour"}
    return [*docs, rl]


@pytest.fixture(scope="module")
def router(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work: Path = tmp_path_factory.mktemp("pd-router")
    config = harness.write_config(work / "router.yaml", _config(sim))
    with harness.start_router(config, work, workers=1, extra_args=["--health-probe-interval-s", "0.3"]) as r:
        yield r


@pytest.fixture(autouse=True)
def _clean(sim: harness.Simulator) -> Iterator[None]:
    sim.reset_faults()
    sim.reset_requests()
    yield
    sim.reset_faults()
    # no test leaves KV held for the next one (at worst it expires)
    for i in (0, 2):
        harness.wait_until(lambda i=i: pdh.pd_state(sim, i)["kv_held"] == 0, HOLD_S + 10, what="held KV gone")


def _client(router: harness.Router) -> openai.OpenAI:
    return router.openai(max_retries=0, timeout=60)


def _rid() -> str:
    return uuid.uuid4().hex


# --- connectors on the wire ---------------------------------------------------------------


@pytest.mark.parametrize("connector", CONNECTORS)
def test_connector_non_streamed(router: harness.Router, sim: harness.Simulator, connector: str) -> None:
    rid = _rid()
    r = _client(router).chat.completions.create(model=f"pd-{connector}", messages=MSGS, max_tokens=5,
                                                extra_headers={"X-Request-ID": rid})
    assert r.choices[0].message.content and r.usage.completion_tokens == 5
    seen = pdh.hops(sim, rid)
    assert len(seen) == 2 and all(len(v) == 1 for v in seen.values()), seen
    (p_idx, (p,)), (d_idx, (d,)) = sorted(seen.items())
    assert (p_idx, d_idx) in ((0, 1), (2, 3)), seen  # a pair of one group
    assert p["tokens_out"] == 1 and p["stream"] is False and p["status"] == "completed"
    assert d["tokens_out"] == 5 and d["status"] == "completed"
    if connector in ("nixl", "mooncake"):
        assert p["pd"]["hop"] == "prefill" and d["pd"]["hop"] == "decode", (p, d)
        assert d["pd"]["kv_tokens"] > 0  # the decode read the prefill's KV
        assert pdh.pd_state(sim, d_idx)["remote_prefill_decodes"] == 1
    else:  # Kthena's http connector: two ordinary requests, nothing held or read
        assert p["pd"] is None and d["pd"] is None, (p, d)
        assert pdh.pd_state(sim, p_idx)["kv_sent"] == 0


@pytest.mark.parametrize("connector", CONNECTORS)
def test_connector_streamed(router: harness.Router, sim: harness.Simulator, connector: str) -> None:
    rid = _rid()
    before = pdh.metric(router, "kthena_router_pd_requests_total", model_server=f"default/pd-{connector}",
                        mode="two_hop")
    stream = _client(router).chat.completions.create(model=f"pd-{connector}", messages=MSGS, max_tokens=6,
                                                     stream=True, extra_headers={"X-Request-ID": rid})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and all(c.usage is None for c in chunks)  # the injected usage chunk stays hidden

    def counted() -> Any:
        # the router counts and the engine logs after the last byte went out: wait for both
        seen = pdh.hops(sim, rid)
        fams = harness.parse_metrics(router.metrics_text())
        server = f"default/pd-{connector}"
        done = (sum(len(v) for v in seen.values()) >= 2
                and harness.metric_value(fams, "kthena_router_pd_requests_total", model_server=server,
                                         mode="two_hop") > before
                and harness.metric_value(fams, "kthena_router_pd_kv_wait_seconds_count", model_server=server,
                                         connector=connector) >= 1
                and harness.metric_value(fams, "kthena_router_request_prefill_duration_seconds_count",
                                         model=f"pd-{connector}", status_code="200") >= 1
                and harness.metric_value(fams, "kthena_router_pd_decode_ttft_seconds_count",
                                         model_server=server) >= 1)
        return (seen, fams) if done else None

    seen, fams = harness.wait_until(counted, 10, what="the request's hops and PD metrics")
    (p_idx, (p,)), (d_idx, (d,)) = sorted(seen.items())
    assert p["stream"] is False and p["tokens_out"] == 1
    assert d["stream"] is True and d["tokens_out"] == 6
    assert harness.metric_value(fams, "kthena_router_pd_requests_total", model_server=f"default/pd-{connector}",
                                mode="two_hop") == before + 1


def test_completions_api_and_usage_for_the_client(router: harness.Router, sim: harness.Simulator) -> None:
    stream = _client(router).completions.create(model="pd-nixl", prompt="once upon a time", max_tokens=4,
                                                stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 4  # the decode hop's usage, not the prefill's


# --- topology problems ----------------------------------------------------------------------


def test_server_without_prefill_endpoint_is_503_with_the_reason(router: harness.Router, sim: harness.Simulator) -> None:
    with pytest.raises(openai.APIStatusError) as ei:
        _client(router).chat.completions.create(model="pd-noprefill", messages=MSGS, max_tokens=2)
    err = ei.value
    assert err.status_code == 503
    assert err.body["code"] == "pd_unavailable" and "has no prefill endpoint" in err.body["message"], err.body
    assert sum(sim.received()) == 0  # never served by one hop


# --- failures before the first byte ----------------------------------------------------------


def test_prefill_down_moves_to_the_next_pair(router: harness.Router, sim: harness.Simulator) -> None:
    sim.set_faults(0, error_rate=1.0, error_status=500)
    client = _client(router)
    sent = 0
    # until a request has tried group a's pair first (ties between the decodes are broken per request)
    while sim.requests(0)["errored"] == 0 and sent < 40:
        r = client.chat.completions.create(model="pd-nixl", messages=MSGS, max_tokens=3)
        assert r.choices[0].message.content
        sent += 1
    assert sim.requests(1)["received"] == 0  # group a's decode never ran after its failed prefill
    assert sim.requests(0)["errored"] >= 1 and sim.requests(3)["completed"] == sent
    assert pdh.metric(router, "kthena_router_pd_hop_failures_total", model_server="default/pd-nixl",
                      side="prefill") >= 1


def test_prefill_down_without_another_pair_is_502_and_no_decode(router: harness.Router,
                                                                sim: harness.Simulator) -> None:
    sim.set_faults(0, error_rate=1.0, error_status=500)
    with pytest.raises(openai.APIStatusError) as ei:
        _client(router).chat.completions.create(model="pd-single", messages=MSGS, max_tokens=3, stream=True)
    assert ei.value.status_code == 502 and "prefill hop" in ei.value.body["message"], ei.value.body
    assert sim.requests(1)["received"] == 0  # no decode that would compute the prompt itself


def test_decode_down_moves_to_the_next_pair(router: harness.Router, sim: harness.Simulator) -> None:
    sim.set_faults(1, refuse_connections=True)
    client = _client(router)
    try:
        for _ in range(4):
            r = client.chat.completions.create(model="pd-http", messages=MSGS, max_tokens=3)
            assert r.choices[0].message.content
        assert sim.requests(3)["completed"] == 4
        with pytest.raises(openai.APIStatusError) as ei:
            client.chat.completions.create(model="pd-single", messages=MSGS, max_tokens=3)
        assert ei.value.status_code == 502 and "decode hop" in ei.value.body["message"], ei.value.body
    finally:
        sim.set_faults(1, refuse_connections=False)


def test_decode_dying_mid_stream_ends_with_an_error_event(router: harness.Router, sim: harness.Simulator) -> None:
    for i in (1, 3):
        sim.set_faults(i, die_after_tokens=3)
    with httpx.Client(timeout=60) as http:
        lines = pdh.sse_lines(router, http, "pd-nixl", _rid(), max_tokens=50)
    assert lines[-1].startswith('data: {"error"'), lines[-3:]
    assert "data: [DONE]" not in lines
    assert sim.requests(1)["received"] + sim.requests(3)["received"] == 1  # no retry after the first byte


def test_prefill_without_kv_params_is_never_followed_by_its_decode(router: harness.Router,
                                                                  sim: harness.Simulator) -> None:
    # engine 4 has no KV connector: its reply's kv_transfer_params is null
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as ei:
            _client(router).chat.completions.create(model="pd-fake", messages=MSGS, max_tokens=3, stream=stream)
        assert ei.value.status_code == 502 and "kv_transfer_params" in ei.value.body["message"], ei.value.body
    assert sim.requests(4)["completed"] == 2 and sim.requests(1)["received"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_failed_kv_read_is_not_recomputed_in_silence(router: harness.Router, sim: harness.Simulator,
                                                     stream: bool) -> None:
    # the decode starts after the prefill's hold timeout: its KV read fails (policy `fail`)
    sim.set_faults(1, first_byte_delay_s=HOLD_S + 1.0)
    rid = _rid()
    with pytest.raises(openai.APIStatusError) as ei:
        _client(router).chat.completions.create(model="pd-single", messages=MSGS, max_tokens=3, stream=stream,
                                                extra_headers={"X-Request-ID": rid})
    assert ei.value.status_code == 502 and "decode hop" in ei.value.body["message"], ei.value.body
    st = pdh.pd_state(sim, 1)
    assert st["kv_load_failures"] == 1 and st["kv_recomputed"] == 0, st
    assert pdh.pd_state(sim, 0)["kv_expired"] == 1


# --- client disconnect ------------------------------------------------------------------------


def test_disconnect_during_prefill_cancels_it_and_sends_no_decode(router: harness.Router,
                                                                  sim: harness.Simulator) -> None:
    sim.set_faults(0, token_delay_s=5.0)
    rid = _rid()
    body = {"model": "pd-single", "messages": MSGS, "max_tokens": 5}
    with httpx.Client(timeout=httpx.Timeout(60, read=1.0)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{router.openai_url}/chat/completions", json=body, headers={"X-Request-ID": rid})
    pdh.wait_entry(sim, 0, rid, ("aborted",))
    assert pdh.pd_state(sim, 0)["aborted_prefill"] == 1
    time.sleep(0.3)
    assert sim.requests(1)["received"] == 0


@pytest.mark.parametrize("connector", ["http", "nixl"])
def test_disconnect_during_decode_cancels_it(router: harness.Router, sim: harness.Simulator, connector: str) -> None:
    for i in (1, 3):
        sim.set_faults(i, token_delay_s=0.2)
    rid = _rid()
    body = {"model": f"pd-{connector}", "messages": MSGS, "max_tokens": 200, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions", json=body,
                         headers={"X-Request-ID": rid}) as resp:
            assert resp.status_code == 200
            got = [line for _, line in zip(range(4), resp.iter_lines())]
            assert any(line.startswith("data: ") for line in got)
    seen = pdh.hops(sim, rid)
    (p_idx, (p,)), (d_idx, _) = sorted(seen.items())
    assert p["status"] == "completed"  # the prefill hop was over
    entry = pdh.wait_entry(sim, d_idx, rid, ("aborted",))
    assert entry["tokens_out"] < 200
    if connector == "nixl":
        assert pdh.pd_state(sim, d_idx)["aborted_decode"] == 1


# --- rate limits --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_rate_limit_charges_the_decode_hop_once(router: harness.Router, sim: harness.Simulator, stream: bool) -> None:
    charged = "kthena_router_ratelimit_charged_tokens_total"
    before_in = pdh.metric(router, charged, model_route="default/pd-rl", token_type="input")
    before_out = pdh.metric(router, charged, model_route="default/pd-rl", token_type="output")
    rid = _rid()
    client = _client(router)
    if stream:
        chunks = list(client.chat.completions.create(model="pd-rl", messages=MSGS, max_tokens=7, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_headers={"X-Request-ID": rid}))
        usage = next(c.usage for c in chunks if c.usage is not None)
    else:
        usage = client.chat.completions.create(model="pd-rl", messages=MSGS, max_tokens=7,
                                               extra_headers={"X-Request-ID": rid}).usage
    seen = pdh.hops(sim, rid)
    assert len(seen) == 2  # two hops ran, both read the prompt
    assert usage.completion_tokens == 7 and usage.prompt_tokens > 0

    def settled() -> bool:
        return pdh.metric(router, charged, model_route="default/pd-rl", token_type="output") - before_out == 7

    harness.wait_until(settled, 10, what="rate-limit settlement")
    assert pdh.metric(router, charged, model_route="default/pd-rl", token_type="input") - before_in \
        == usage.prompt_tokens  # once, not twice


def test_endpoint_tokens_count_input_at_the_prefill_and_output_at_the_decode(
        router: harness.Router, sim: harness.Simulator) -> None:
    """kthena_router_endpoint_tokens_total (the autoscaler's router signals): each side of a
    pair is charged with the work it did."""
    name = "kthena_router_endpoint_tokens_total"
    prefill, decode = (f"127.0.0.1:{sim.ports[i]}" for i in (0, 1))

    def counts() -> dict[tuple[str, str], float]:
        return {(ep, t): pdh.metric(router, name, model_server="default/pd-single", endpoint=ep, token_type=t)
                for ep in (prefill, decode) for t in ("input", "output")}

    before = counts()
    r = router.openai().chat.completions.create(model="pd-single", messages=MSGS, max_tokens=5)
    assert r.usage is not None

    def delta() -> dict[tuple[str, str], float]:
        now = counts()
        return {k: now[k] - before[k] for k in now}

    harness.wait_until(lambda: delta()[(decode, "output")] == r.usage.completion_tokens, 10, what="decode output")
    d = delta()
    assert d[(prefill, "input")] == r.usage.prompt_tokens
    assert d[(decode, "input")] == 0 and d[(prefill, "output")] == 0
