"""prefill-cost (cost-based placement, issue 15): the scheduler counts each dispatch's
uncached blocks as the engine's pending prefill work until the attempt's first token (or
its end), and the score trades that work against this request's own uncached blocks."""

from __future__ import annotations

import dataclasses

import pytest
from test_scheduling_scheduler import KEY, SYSTEM, cfg, chat, endpoints, sched, snap

from kthena_router.scheduling.config import ConfigError, load_router_configuration_bytes
from kthena_router.scheduling.request import RequestInfo


def _pending(s, ep) -> float:  # type: ignore[no-untyped-def]
    sig = s.signals(KEY, ep.key)
    assert sig is not None
    return float(sig["pending_blocks"])


def _fresh(doc: str):  # type: ignore[no-untyped-def]
    """A scheduler over two idle, freshly scraped endpoints."""
    s, _ = sched(doc)
    eps = endpoints(2)
    s.sync({KEY: eps})
    for ep in eps:
        s.on_snapshot(snap(ep))
    return s, eps


def test_pending_work_lasts_until_the_first_token_or_the_end() -> None:
    s, eps = _fresh(cfg("prefill-cost"))
    info = chat("r1", "first question")
    first = s.candidates(KEY, eps, info)[0]
    s.dispatched(first, info)
    other = next(ep for ep in eps if ep is not first)
    total = len(info.hashes)
    assert _pending(s, first) == total  # a cold miss: its whole prompt
    assert _pending(s, other) == 0
    # while it is pending, a second cold request goes elsewhere
    assert s.candidates(KEY, eps, _cold("r2"))[0] is other
    info.prefilled()  # its first token: the work is done, though it still decodes
    assert _pending(s, first) == 0
    s.finished(first, 0.01, None, info)  # released once only
    assert _pending(s, first) == 0
    hits = []
    for i in range(5):  # cache hits on the holder count only their few new blocks
        hit = chat(f"r3-{i}", "another question")
        chosen = s.candidates(KEY, eps, hit)[0]
        assert chosen is first
        s.dispatched(chosen, hit)
        hits.append(hit)
    assert 0 < _pending(s, first) < 0.5 * total
    for hit in hits:  # not streamed: released at the end
        s.finished(first, None, None, hit)
    assert _pending(s, first) == 0


def _cold(rid: str) -> RequestInfo:
    text = " ".join(f"{rid}-word{j}" for j in range(600))
    return RequestInfo(rid, "/v1/chat/completions",
                       {"model": "demo", "messages": [{"role": "user", "content": text}]}, "demo", "", "demo")


MIX = cfg("prefix-cache", "least-request").replace(
    "      - {name: least-request, weight: 1}\n",
    "      - {name: least-request, weight: 1}\n      - {name: prefill-cost, weight: 2}\n")


def test_pending_cold_work_on_the_holder_spills_a_hit_elsewhere() -> None:
    s, eps = _fresh(MIX)
    info = chat("warm", "q")
    holder = s.candidates(KEY, eps, info)[0]
    s.dispatched(holder, info)
    other = next(ep for ep in eps if ep is not holder)
    # the warm-up is done: nothing pending, a hit costs its few new blocks on the holder
    s.finished(holder, 0.1, None, info)
    hit = chat("hit", "a follow-up")
    assert s.candidates(KEY, eps, hit)[0] is holder
    s.dispatched(holder, hit)
    # two long cold prompts dispatched to the holder are being prefilled there
    for i in range(2):
        cold = _cold(f"cold-{i}")
        s.candidates(KEY, eps, cold)
        s.dispatched(holder, cold)
    s.on_snapshot(snap(other, running=3))  # equal load (3 in flight on the holder)
    assert s.candidates(KEY, eps, chat("spill", "one more"))[0] is other
    # without that pending work, the same loads keep the hit on its holder
    s2, _ = sched(cfg("prefix-cache", "least-request"))
    s2.sync({KEY: eps})
    for ep in eps:
        s2.on_snapshot(snap(ep, running=3))
    warm2 = chat("warm2", "q")
    s2.candidates(KEY, eps, warm2)
    s2.dispatched(holder, warm2)
    s2.on_snapshot(snap(holder, running=3))
    assert s2.candidates(KEY, eps, chat("stay", "one more"))[0] is holder


def _with_args(args: str) -> str:
    return cfg("prefill-cost") + f"  pluginConfig:\n  - name: prefill-cost\n    args: {args}\n"


def test_prefill_cost_takes_only_its_own_args() -> None:
    with pytest.raises(ConfigError, match="maxWaitingRequests"):
        load_router_configuration_bytes(_with_args("{maxWaitingRequests: 3}").encode(), source="t.yaml")
    with pytest.raises(ConfigError, match="copyCost"):
        load_router_configuration_bytes(_with_args("{copyCost: 5}").encode(), source="t.yaml")
    c = load_router_configuration_bytes(_with_args("{copyCost: 0.5}").encode(), source="t.yaml")
    assert c.scheduler.scorer_args()["prefill-cost"]["copyCost"] == 0.5
    with pytest.raises(ConfigError, match="realizedPrefix"):
        load_router_configuration_bytes(_with_args("{realizedPrefix: 2}").encode(), source="t.yaml")
    c = load_router_configuration_bytes(_with_args("{realizedPrefix: false}").encode(), source="t.yaml")
    assert c.scheduler.scorer_args()["prefill-cost"]["realizedPrefix"] is False


@pytest.mark.parametrize("realized, stays", [("true", False), ("false", True)])
def test_a_holder_that_evicted_its_prefix_loses_its_credit(realized: str, stays: bool) -> None:
    # the argument reaches the Rust policy from the file: the same measurements, the
    # opposite decisions
    s, eps = _fresh(_with_args(f"{{realizedPrefix: {realized}, copyCost: 0}}"))
    warm = chat("warm", "q")
    holder = s.candidates(KEY, eps, warm)[0]
    for info in (warm, chat("hit", "q2")):  # a cold prompt, then a predicted hit
        s.candidates(KEY, eps, info)
        s.dispatched(holder, info)
        s.finished(holder, 0.1, None, info)
    s.on_snapshot(dataclasses.replace(snap(holder), last_prefix_hit_rate=0.0))  # it served none
    # a cold prompt half as long is being prefilled on the holder: the hit's turn there costs
    # that half plus its few uncached blocks as credited, plus its whole prompt as realized
    half = "X" + SYSTEM[1:len(SYSTEM) // 2]
    cold = RequestInfo("cold", "/v1/chat/completions",
                       {"model": "demo", "messages": [{"role": "system", "content": half},
                                                      {"role": "user", "content": "q"}]}, "demo", "", "demo")
    s.candidates(KEY, eps, cold)
    s.dispatched(holder, cold)
    chosen = s.candidates(KEY, eps, chat("again", "q3"))[0]
    assert (chosen is holder) == stays


def test_a_scrape_pushes_the_measured_realization_to_every_scorer() -> None:
    s, eps = _fresh(_with_args("{realizedPrefix: true}"))
    warm = chat("warm", "q")
    holder = s.candidates(KEY, eps, warm)[0]
    s.dispatched(holder, warm)
    hit = chat("warm", "q2")  # the same system prompt: the index predicts its hit
    s.candidates(KEY, eps, hit)
    s.dispatched(holder, hit)
    s.on_snapshot(dataclasses.replace(snap(holder), last_prefix_hit_rate=0.0))
    sig = s.signals(KEY, holder.key)
    assert sig is not None and sig["hit_realization"] == 0.0
    # an engine that reports nothing: unmeasured, trusted as credited
    other = next(ep for ep in eps if ep is not holder)
    s.on_snapshot(snap(other))
    sig = s.signals(KEY, other.key)
    assert sig is not None and sig["hit_realization"] == 1.0


@pytest.mark.parametrize("kv_usage, stays", [(1.0, True), (0.0, False)])
def test_copy_cost_keeps_a_hit_off_an_engine_whose_kv_is_full(kv_usage: float, stays: bool) -> None:
    s, eps = _fresh(_with_args("{copyCost: 1}"))
    warm = chat("warm", "q")
    holder = s.candidates(KEY, eps, warm)[0]
    s.dispatched(holder, warm)
    s.finished(holder, 0.1, None, warm)
    other = next(ep for ep in eps if ep is not holder)
    # a cold prompt as long as the hit's is being prefilled on the holder: one cold prefill
    # elsewhere costs less than the hit's turn there, unless the copy it makes is priced
    body = {"model": "demo", "messages": [{"role": "system", "content": "X" + SYSTEM[1:]},
                                          {"role": "user", "content": "q"}]}
    cold = RequestInfo("cold", "/v1/chat/completions", body, "demo", "", "demo")
    s.candidates(KEY, eps, cold)
    s.dispatched(holder, cold)
    s.on_snapshot(dataclasses.replace(snap(other), last_kv_usage=kv_usage))
    chosen = s.candidates(KEY, eps, chat("hit", "q"))[0]
    assert (chosen is holder) == stays


def test_a_front_decision_counts_pending_work_on_every_scorer_of_the_endpoint() -> None:
    # two ModelServers over the same engines; the front added the work to the deciding
    # server's Scorer itself, front_dispatched adds it to the other's, as `dispatched` does
    other_key = ("default", "other")
    s, _ = sched(cfg("prefill-cost"))
    eps = endpoints(2)
    s.sync({KEY: eps, other_key: eps})
    for ep in eps:
        s.on_snapshot(snap(ep))
    info = chat("front", "q")
    s.front_dispatched(KEY, eps[0], info, 0.0, 0.0, -1.0, pending=40.0)
    assert _pending_of(s, other_key, eps[0]) == 40 and _pending_of(s, other_key, eps[1]) == 0
    assert _pending(s, eps[0]) == 0  # the deciding Scorer is the front's to count
    info.prefilled()
    assert _pending_of(s, other_key, eps[0]) == 0
    # without prefill-cost's pending (-1): nothing counted, nothing to release
    info2 = chat("front2", "q")
    s.front_dispatched(KEY, eps[1], info2, 0.0, 0.0, -1.0)
    assert info2.pending is None and _pending_of(s, other_key, eps[1]) == 0


def _pending_of(s, key, ep) -> float:  # type: ignore[no-untyped-def]
    sig = s.signals(key, ep.key)
    assert sig is not None
    return float(sig["pending_blocks"])
