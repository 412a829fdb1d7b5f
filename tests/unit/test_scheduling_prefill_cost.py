"""prefill-cost (cost-based placement, issue 15 step 11): the scheduler feeds each dispatch's
uncached blocks to the Rust scorer as the engine's pending prefill work (decayed with its
TTFT), and the score trades that work against this request's own uncached blocks."""

from __future__ import annotations

import time

import pytest
from test_scheduling_scheduler import KEY, cfg, chat, endpoints, sched, snap

from kthena_router.scheduling.config import ConfigError, load_router_configuration_bytes
from kthena_router.scheduling.request import RequestInfo


def _pending(s, ep) -> float:  # type: ignore[no-untyped-def]
    sig = s.signals(KEY, ep.key)
    assert sig is not None
    return float(sig["pending_blocks"])


def test_dispatch_adds_pending_work_that_decays_with_the_ttft() -> None:
    s, _ = sched(cfg("prefill-cost"))
    eps = endpoints(2)
    s.sync({KEY: eps})
    for ep in eps:
        s.on_snapshot(snap(ep))
    info = chat("r1", "first question")
    first = s.candidates(KEY, eps, info)[0]
    s.dispatched(first, info)
    other = next(ep for ep in eps if ep is not first)
    total = len(info.hashes)
    assert _pending(s, first) == total  # a cold miss, no TTFT sample yet: kept whole
    assert _pending(s, other) == 0
    # while that prefill is pending, a second cold request of the same size is no cheaper
    # there than elsewhere; once the engine's TTFT is known the work decays
    s.finished(first, 0.001)
    time.sleep(0.05)  # 50 time constants
    assert _pending(s, first) < 0.01 * total
    for i in range(5):  # cache hits on the holder add only their few new blocks
        info = chat(f"r2-{i}", "another question")
        chosen = s.candidates(KEY, eps, info)[0]
        assert chosen is first
        s.dispatched(chosen, info)
        s.finished(chosen, 0.001)
    assert _pending(s, first) < 0.2 * total


MIX = cfg("prefix-cache", "least-request").replace(
    "      - {name: least-request, weight: 1}\n",
    "      - {name: least-request, weight: 1}\n      - {name: prefill-cost, weight: 2}\n")


def test_pending_cold_work_on_the_holder_spills_a_hit_elsewhere() -> None:
    s, _ = sched(MIX)
    eps = endpoints(2)
    s.sync({KEY: eps})
    for ep in eps:
        s.on_snapshot(snap(ep))
    info = chat("warm", "q")
    holder = s.candidates(KEY, eps, info)[0]
    s.dispatched(holder, info)
    other = next(ep for ep in eps if ep is not holder)
    # engine TTFTs known (long: no decay within the test); the holder's pending work is
    # one prompt, so a hit there costs about what a miss elsewhere does: affinity decides
    s.finished(holder, 1000.0)
    s.finished(other, 1000.0)
    hit = chat("hit", "a follow-up")
    assert s.candidates(KEY, eps, hit)[0] is holder
    s.dispatched(holder, hit)
    # two long cold prompts dispatched to the holder are being prefilled there
    for i in range(2):
        text = " ".join(f"word{i}-{j}" for j in range(600))
        cold = RequestInfo(f"cold-{i}", "/v1/chat/completions",
                           {"model": "demo", "messages": [{"role": "user", "content": text}]},
                           "demo", "", "demo")
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


def test_prefill_cost_has_no_arguments() -> None:
    doc = cfg("prefill-cost") + "  pluginConfig:\n  - name: prefill-cost\n    args: {maxWaitingRequests: 3}\n"
    with pytest.raises(ConfigError):
        load_router_configuration_bytes(doc.encode(), source="t.yaml")
