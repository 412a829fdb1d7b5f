"""PD pairing: decode by the decode-side plugins, then a prefill of the SAME group by the
prefill-side plugins (prefix affinity); retry order; conditional disaggregation around
minUncachedTokens; following routing states, engine snapshots and reloads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pd_fixtures import KEY, ep, pd_state
from prometheus_client import CollectorRegistry

from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import RouterMetrics
from kthena_router.pd.config import PdServerSettings
from kthena_router.pd.pairing import PdPairer
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.scheduling.request import RequestInfo

SYSTEM = "You are a careful assistant who answers in full sentences. " * 40  # ~2.4 kB shared prefix
TWO_HOP = PdServerSettings()


def chat(rid: str, question: str, system: str = SYSTEM) -> RequestInfo:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    return RequestInfo(rid, "/v1/chat/completions", body, "upstream-m", "", "m")


def pairer(pd_yaml: str = "", **kw) -> tuple[PdPairer, RouterMetrics]:
    pd = load_router_configuration_bytes(pd_yaml.encode(), source="rc.yaml").pd
    m = RouterMetrics(CollectorRegistry())
    return PdPairer(pd, m, **kw), m


@pytest.fixture
def state(tmp_path: Path):
    # group a: prefill 9001, 9002; decode 9003, 9004. group b: prefill 9005; decode 9006.
    return pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9002, "a", "prefill"), ep(9003, "a", "decode"),
                               ep(9004, "a", "decode"), ep(9005, "b", "prefill"), ep(9006, "b", "decode")])


def eps_by_port(state) -> dict[int, object]:
    return {e.port: e for e in state.targets[KEY]}


def load_up(p: PdPairer, e, n: int, side: str) -> None:
    for _ in range(n):
        p.dispatched(e, None, side)


def test_decode_is_chosen_by_load_and_each_pair_stays_in_its_group(state) -> None:
    p, m = pairer()
    p.on_state(state)
    e = eps_by_port(state)
    load_up(p, e[9003], 3, "decode")  # in flight on this worker: least-request sees them at once
    load_up(p, e[9006], 1, "decode")
    pairs = p.pairs(state.pd[KEY], chat("r1", "q"), TWO_HOP)
    assert [x.decode.port for x in pairs] == [9004, 9006, 9003]
    for x in pairs:
        assert x.group == state.pd[KEY].group_of[x.decode.key] == state.pd[KEY].group_of[x.prefill.key]
    assert pairs[1].prefill.port == 9005
    for _ in range(3):
        p.finished(e[9003], "decode", ttft_s=0.1, tpot_s=0.01)
    p.finished(e[9006], "decode")
    load_up(p, e[9004], 2, "decode")
    load_up(p, e[9006], 1, "decode")
    assert p.pairs(state.pd[KEY], chat("r2", "q"), TWO_HOP)[0].decode.port == 9003


def test_prefill_follows_prefix_affinity_within_the_group_only(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    e = eps_by_port(state)
    load_up(p, e[9006], 5, "decode")  # decode in group a first
    first = chat("r1", "first question")
    pairs = p.pairs(state.pd[KEY], first, TWO_HOP)
    # the prompt was prefilled by 9002 (the dispatcher's choice, e.g. after a retry)
    p.dispatched(e[9002], first, "prefill")
    p.dispatched(pairs[0].decode, first, "decode")
    for i in range(10):  # same system prompt, other questions: the prefill that holds it
        got = p.pairs(state.pd[KEY], chat(f"r2-{i}", f"question {i}"), TWO_HOP)
        assert got[0].group == "a" and got[0].prefill.port == 9002
        assert [x.prefill.port for x in got if x.group == "b"] == [9005]  # group b's own prefill
    # group b's prefill holding a prompt never draws group a's decodes to it
    other = chat("o1", "q", system="Another system prompt entirely. " * 60)
    p.dispatched(e[9005], other, "prefill")
    for x in p.pairs(state.pd[KEY], chat("o2", "q2", system="Another system prompt entirely. " * 60), TWO_HOP):
        assert (x.group, x.prefill.port in (9001, 9002)) in (("a", True), ("b", False))


def test_retry_order_moves_to_another_prefill_of_the_group(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    e = eps_by_port(state)
    load_up(p, e[9006], 5, "decode")
    for i in range(20):
        pairs = p.pairs(state.pd[KEY], chat(f"r{i}", f"q{i}"), TWO_HOP)
        a = [x for x in pairs if x.group == "a"]
        assert len(a) == 2 and {x.decode.port for x in a} == {9003, 9004}
        assert {x.prefill.port for x in a} == {9001, 9002}  # the second try is not the failed prefill
        assert pairs[-1].decode.port == 9006 and pairs[-1].prefill.port == 9005


def test_unusable_endpoints_are_left_out(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    e = eps_by_port(state)
    e[9004].health.healthy = False
    e[9001].health.healthy = False
    pairs = p.pairs(state.pd[KEY], chat("r", "q"), TWO_HOP)
    assert sorted(x.decode.port for x in pairs) == [9003, 9006]
    assert {x.prefill.port for x in pairs} == {9002, 9005}


def test_a_server_without_pairs_gets_none(tmp_path: Path) -> None:
    st = pd_state(tmp_path, [ep(9001, "a", "prefill")])
    p, _ = pairer()
    p.on_state(st)
    assert st.pd[KEY].problem and p.pairs(st.pd[KEY], chat("r", "q"), TWO_HOP) == []


# --- conditional disaggregation ----------------------------------------------------------


def test_short_prompt_goes_to_decode_alone_below_the_threshold(state) -> None:
    p, m = pairer()
    p.on_state(state)
    small = chat("r1", "hi", system="Be brief.")  # ~60 bytes: ~15 tokens at the prior 4 B/token
    pairs = p.pairs(state.pd[KEY], small, PdServerSettings(min_uncached_tokens=64))
    assert pairs[0].prefill is None
    assert all(x.prefill is not None for x in pairs[1:]) and len(pairs) == 3
    assert p.uncached_tokens(pairs[0].decode, small) < 64
    # at the threshold and above: two hops
    n = p.uncached_tokens(pairs[0].decode, small)
    assert p.pairs(state.pd[KEY], small, PdServerSettings(min_uncached_tokens=int(n)))[0].prefill is not None
    assert p.pairs(state.pd[KEY], small, TWO_HOP)[0].prefill is not None  # 0 = always two hops
    modes = {s.labels["mode"]: s.value for s in m.registry.collect() if s.name == "kthena_router_pd_decisions"
             for s in s.samples if s.name.endswith("_total")}
    assert modes == {"decode_only": 1.0, "two_hop": 2.0}


def test_decode_that_holds_the_prompt_serves_the_next_turn_alone(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    e = eps_by_port(state)
    load_up(p, e[9003], 5, "decode")
    load_up(p, e[9006], 5, "decode")  # 9004 is the decode choice
    rule = PdServerSettings(min_uncached_tokens=100)
    turn1 = chat("t1", "first question")
    pairs = p.pairs(state.pd[KEY], turn1, rule)
    assert pairs[0].decode.port == 9004 and pairs[0].prefill is not None  # ~600 uncached tokens
    assert p.uncached_tokens(e[9004], turn1) >= 100
    p.dispatched(pairs[0].prefill, turn1, "prefill")
    p.dispatched(pairs[0].decode, turn1, "decode")  # 9004 now holds the whole prompt's KV
    turn2 = chat("t2", "first question, and one more")
    assert p.uncached_tokens(e[9004], turn2) < 100 <= p.uncached_tokens(e[9003], turn2)
    pairs = p.pairs(state.pd[KEY], turn2, rule)
    assert pairs[0] == (e[9004], None, "a") and all(x.prefill is not None for x in pairs[1:])


def test_the_estimate_uses_the_learned_bytes_per_token(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    info = chat("r", "q")
    d = p.pairs(state.pd[KEY], info, TWO_HOP)[0].decode
    before = p.uncached_tokens(d, info)
    assert before == pytest.approx(info.prompt_bytes / 4.0)  # the prior, before any usage report
    for _ in range(200):  # engines report ~10 bytes per token for this traffic
        p.observe_prompt_tokens(info, info.prompt_bytes // 10)
    assert p.uncached_tokens(d, info) < before / 2
    assert p.pairs(state.pd[KEY], info, PdServerSettings(min_uncached_tokens=int(before * 0.6)))[0].prefill is None


def test_no_prompt_to_hash_means_two_hops(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    info = RequestInfo("r", "/v1/embeddings", {"input": "x"}, "upstream-m", "", "m")
    assert p.pairs(state.pd[KEY], info, PdServerSettings(min_uncached_tokens=10 ** 6))[0].prefill is not None


# --- plugins per side, engine snapshots, reloads, states ---------------------------------


def snap(key: str, running: int, kv: float = 0.1) -> EndpointSnapshot:
    return EndpointSnapshot(key, "vllm", 1.0, 1.0, False, 0, None, last_running=running, last_waiting=0,
                            last_kv_usage=kv)


def test_scraped_engine_state_reaches_both_sides(state) -> None:
    p, _ = pairer(scraped=True)
    p.on_state(state)
    for port, running in ((9003, 7), (9004, 0), (9006, 3), (9001, 0), (9002, 9), (9005, 0)):
        p.on_snapshot(snap(f"127.0.0.1:{port}", running))
    pairs = p.pairs(state.pd[KEY], chat("r", "q"), TWO_HOP)
    assert [x.decode.port for x in pairs] == [9004, 9006, 9003]
    assert pairs[0].prefill.port == 9001  # no prefix yet: the idle prefill of the group
    p.on_snapshot(snap("127.0.0.1:7777", 0))  # not a PD endpoint: ignored


def test_decode_side_plugins_are_configurable(state) -> None:
    p, _ = pairer("pd: {decode: {plugins: {Score: {enabled: [{name: gpu-usage, weight: 1}]}}}}\n", scraped=True)
    p.on_state(state)
    for port, running, kv in ((9003, 0, 0.9), (9004, 9, 0.1), (9006, 0, 0.5)):
        p.on_snapshot(snap(f"127.0.0.1:{port}", running, kv))
    assert [x.decode.port for x in p.pairs(state.pd[KEY], chat("r", "q"), TWO_HOP)] == [9004, 9006, 9003]


def test_reload_swaps_only_the_changed_side_and_keeps_counts_balanced(state) -> None:
    p, _ = pairer()
    p.on_state(state)
    e = eps_by_port(state)
    old_decode, old_prefill = p.decode.inner, p.prefill.inner
    load_up(p, e[9003], 2, "decode")
    new = load_router_configuration_bytes(b"pd: {decode: {plugins: {Score: {enabled: [{name: least-request, "
                                          b"weight: 1}]}}}, minUncachedTokens: 5}\n", source="rc.yaml").pd
    p.configure(new)
    assert p.decode.inner is not old_decode and p.prefill.inner is old_prefill and p.settings is new
    assert p.decode.inner.signals((*KEY, "decode"), e[9003].key)["in_flight"] == 0  # synced, fresh counts
    p.finished(e[9003], "decode")  # attempts from before the swap end: not on the new scheduler
    p.finished(e[9003], "decode")
    load_up(p, e[9004], 1, "decode")
    assert p.decode.inner.signals((*KEY, "decode"), e[9004].key)["in_flight"] == 1
    assert p.pairs(state.pd[KEY], chat("r", "q"), TWO_HOP)[0].decode.port in (9003, 9006)
    p.configure(new)  # unchanged: nothing rebuilt
    assert p.decode.inner.signals((*KEY, "decode"), e[9004].key)["in_flight"] == 1


def test_states_are_followed_and_problems_logged_once_per_change(tmp_path: Path, caplog) -> None:
    p, m = pairer()
    bad = pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9009, None, "decode")])
    with caplog.at_level(logging.INFO, logger="kthena_router.pd.pairing"):
        p.on_state(bad)
        p.on_state(pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9009, None, "decode")]))  # same again
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2, warnings
        assert "default/s cannot serve" in warnings[0] and "has no decode endpoint" in warnings[0]
        assert "127.0.0.1:9009: no 'group' label" in warnings[1]

        def gauge(name: str, **labels: str) -> float:
            return m.registry.get_sample_value(name, labels)  # type: ignore[return-value]

        assert gauge("kthena_router_pd_servable", model_server="default/s") == 0
        assert gauge("kthena_router_pd_endpoints", model_server="default/s", group="", role="ignored") == 2
        caplog.clear()
        good = pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9002, "a", "decode")])
        p.on_state(good)
        assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert gauge("kthena_router_pd_servable", model_server="default/s") == 1
    assert gauge("kthena_router_pd_endpoints", model_server="default/s", group="a", role="decode") == 1
    assert gauge("kthena_router_pd_endpoints", model_server="default/s", group="", role="ignored") == 0
    pairs = p.pairs(good.pd[KEY], chat("r", "q"), TWO_HOP)
    assert [(x.decode.port, x.prefill.port) for x in pairs] == [(9002, 9001)]
    view = p.debug_view()["servers"][0]
    assert view["groups"] == {"a": {"prefill": ["127.0.0.1:9001"], "decode": ["127.0.0.1:9002"]}}
    assert view["problem"] is None and view["min_uncached_tokens"] == 0 and view["connector"] == "http"


def test_min_uncached_tokens_on_an_sglang_server_is_reported_not_silently_ignored(tmp_path: Path, caplog) -> None:
    p, _ = pairer("pd:\n  minUncachedTokens: 256\n")
    eps = [ep(9001, "a", "prefill"), ep(9002, "a", "decode")]
    with caplog.at_level(logging.WARNING, logger="kthena_router.pd.pairing"):
        p.on_state(pd_state(tmp_path, eps, engine="SGLang"))
        p.on_state(pd_state(tmp_path, eps, engine="SGLang"))  # once per change, not per state
        inert = [r.getMessage() for r in caplog.records if "minUncachedTokens has no effect" in r.getMessage()]
        assert len(inert) == 1 and "default/s" in inert[0], inert
        caplog.clear()
        p.on_state(pd_state(tmp_path, eps))  # vLLM: the setting applies
        assert not [r for r in caplog.records if "no effect" in r.getMessage()]
