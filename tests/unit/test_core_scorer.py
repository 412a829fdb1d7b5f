"""kthena_router._core Scorer: Kthena plugin names, signals held in Rust, one call per request."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router._core import PrefixIndex, Scorer, prefix_seed

ALL_SCORES = [
    ("random", 1),
    ("round-robin", 1),
    ("least-request", 1),
    ("least-latency", 1),
    ("gpu-usage", 1),
    ("prefix-cache", 1),
    ("kvcache-aware", 1),
    ("lora-affinity", 1),
]


def fresh(scorer: Scorer, n: int) -> Scorer:
    for ep in range(n):
        scorer.update_metrics(ep, 0, 0, 0.0, 0.1, 0.01)
    return scorer


def test_config_errors_and_warnings():
    with pytest.raises(ValueError, match="unknown scheduler plugin"):
        Scorer([], [("no-such-plugin", 1)])
    with pytest.raises(ValueError, match="not supported"):
        Scorer([], [("session-affinity", 1)])
    with pytest.raises(ValueError, match="not a filter"):
        Scorer(["gpu-usage"], [])
    with pytest.raises(ValueError, match="TTFTTPOTWeightFactor"):
        Scorer([], [("least-latency", 1)], {"least-latency": {"TTFTTPOTWeightFactor": 3}})
    # Kthena's example configuration loads; unknown arguments only warn.
    s = Scorer(
        ["least-request"],
        [("least-request", 1), ("gpu-usage", 1), ("least-latency", 1), ("prefix-cache", 1)],
        {
            "least-request": {"maxWaitingRequests": 10},
            "least-latency": {"TTFTTPOTWeightFactor": 0.5},
            "prefix-cache": {"blockSizeToHash": 64, "maxBlocksToMatch": 128, "maxHashCacheSize": 50000, "topKMatches": 5},
            "gpu-usage": {"bogus": True, "name": "x"},
        },
    )
    assert len(s.warnings) == 2 and all("gpu-usage" in w for w in s.warnings)


def test_prefix_match_from_the_index_wins_when_load_is_equal():
    ix, seed = PrefixIndex(1000), prefix_seed(b"m", b"")
    prompt = bytes(range(256)) * 4  # 16 blocks of 64
    hashes, _ = ix.match_prompt(prompt, 64, seed, 128)
    ix.insert(5, hashes)
    s = fresh(Scorer([], [("prefix-cache", 1), ("least-request", 1)]), 8)
    _, matches = ix.match_prompt(prompt, 64, seed, 128)
    for req in range(20):
        assert s.schedule(Scorer.request_hash(b"req-%d" % req), matches, None, len(hashes))[0] == 5


def test_misses_spread_by_request_id():
    s = fresh(Scorer([], [("prefix-cache", 1)]), 10)
    firsts = {s.schedule(Scorer.request_hash(b"r%d" % i), None, None, 8)[0] for i in range(100)}
    assert len(firsts) >= 8
    h = Scorer.request_hash(b"same")
    assert s.schedule(h, None, None, 8) == s.schedule(h, None, None, 8)


def test_stale_endpoint_is_not_idle():
    s = Scorer([], [("least-request", 1)])
    s.update_metrics(0, 50, 10, 0.5)
    s.update_metrics(1, 60, 10, 0.5)
    s.update_metrics(2, 0, 0, 0.0)
    assert s.schedule(1, None, None, 0)[0] == 2
    s.mark_stale(2)  # its last scrape said idle; now unknown
    assert s.schedule(1, None, None, 0) == [0, 1, 2]
    sig = s.signals(2)
    assert sig["stale"] and math.isinf(sig["load"])
    s.add_endpoint(3)  # never scraped
    assert s.schedule(1, None, None, 0)[:2] == [0, 1]


def test_in_flight_counts_react_before_the_next_scrape():
    s = Scorer([], [("least-request", 1)])
    s.update_metrics(0, 2, 0, 0.1)
    s.update_metrics(1, 3, 0, 0.1)
    assert s.schedule(1, None, None, 0)[0] == 0
    assert s.add_in_flight(0, 1) == 1 and s.add_in_flight(0, 1) == 2
    assert s.schedule(1, None, None, 0)[0] == 1
    assert s.add_in_flight(0, -5) == 0


def test_lora_requests_only_on_endpoints_with_the_adapter():
    s = fresh(Scorer(["lora-affinity"], [("least-request", 1), ("lora-affinity", 1)]), 4)
    s.set_loras(1, [7], 4)
    s.set_loras(3, [7, 8], 4)
    s.update_metrics(1, 100, 0, 0.9)  # busy, but the only other holder besides 3
    for req in range(30):
        assert set(s.schedule(req, None, 7, 0)) == {1, 3}
    assert len(s.schedule(1, None, None, 0)) == 4
    # No endpoint has adapter 9: those with room to load it remain.
    s.set_loras(0, [1, 2, 3, 4], 4)
    assert 0 not in s.schedule(1, None, 9, 0)


def test_least_request_filter_and_fallback():
    s = fresh(Scorer(["least-request"], [("random", 1)], {"least-request": {"maxWaitingRequests": 4}}), 3)
    s.update_metrics(0, 1, 4, 0.1)
    assert sorted(s.schedule(9, None, None, 0)) == [1, 2]
    s.update_metrics(1, 1, 9, 0.1)
    s.update_metrics(2, 1, 9, 0.1)
    assert sorted(s.schedule(9, None, None, 0)) == [0, 1, 2]  # all would go: filter undone


def test_round_robin_cycles():
    s = fresh(Scorer([], [("round-robin", 1)]), 3)
    assert [s.schedule(r, None, None, 0)[0] for r in range(6)] == [0, 1, 2, 0, 1, 2]


def test_hot_spot_guard():
    s = Scorer([], [("prefix-cache", 4), ("least-request", 1)], hot_spot_abs=10, hot_spot_rel=2)
    for ep, running in enumerate([40, 4, 5]):
        s.update_metrics(ep, running, 0, 0.2)
    assert s.schedule(1, [(0, 10)], None, 10) == [1, 2, 0]
    assert s.hot_spot_count == 1
    s.update_metrics(0, 12, 0, 0.2)  # 8 above the least loaded: affinity keeps it
    assert s.schedule(1, [(0, 10)], None, 10)[0] == 0
    off = Scorer([], [("prefix-cache", 4), ("least-request", 1)], hot_spot_abs=math.inf)
    for ep, running in enumerate([400, 4, 5]):
        off.update_metrics(ep, running, 0, 0.2)
    assert off.schedule(1, [(0, 10)], None, 10)[0] == 0 and off.hot_spot_count == 0


def test_latency_and_gpu_usage():
    s = Scorer([], [("least-latency", 1)], {"least-latency": {"TTFTTPOTWeightFactor": 1.0}})
    s.update_metrics(0, 0, 0, 0.0, 0.5, 0.01)
    s.update_metrics(1, 0, 0, 0.0, 0.2, 0.09)
    assert s.schedule(1, None, None, 0) == [1, 0]
    s.observe_latency(1, ttft_s=5.0)  # the router saw a slow first token
    assert s.schedule(1, None, None, 0) == [0, 1]
    g = Scorer([], [("gpu-usage", 1)])
    for ep, usage in enumerate([0.9, 0.1, 0.5]):
        g.update_metrics(ep, 0, 0, usage)
    assert g.schedule(1, None, None, 0) == [1, 2, 0]


def test_max_candidates_and_endpoint_lifecycle():
    s = Scorer([], [("least-request", 1)], max_candidates=2)
    for ep in range(5):
        s.update_metrics(ep, 5 - ep, 0, 0.1)
    assert s.schedule(1, None, None, 0) == [4, 3]
    assert s.remove_endpoint(4) and not s.remove_endpoint(4)
    assert s.endpoints() == [0, 1, 2, 3]
    assert s.schedule(1, [(4, 3)], None, 3) == [3, 2]  # matches of removed ids ignored
    assert s.signals(4) is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.floats(0, 1), st.booleans()), min_size=1, max_size=30),
    st.integers(0, 2**64 - 1),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 20)), max_size=10),
)
def test_all_plugins_return_an_ordering_of_the_candidates(eps, req, matches):
    s = Scorer(["least-request", "lora-affinity"], ALL_SCORES)
    for i, (running, waiting, usage, stale) in enumerate(eps):
        s.update_metrics(i, running, waiting, usage, 0.1 + i / 100, 0.01)
        if stale:
            s.mark_stale(i)
    out = s.schedule(req, matches, None, 16)
    assert len(out) == len(set(out)) and set(out) <= set(range(len(eps)))
    eligible = {i for i, (_, w, _, st_) in enumerate(eps) if not st_ and w < 10}
    assert set(out) == (eligible or set(range(len(eps))))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 16), min_size=2, max_size=20), st.integers(0, 2**64 - 1))
def test_prefix_only_puts_a_longest_match_first(blocks, req):
    s = fresh(Scorer([], [("prefix-cache", 1)]), len(blocks))
    out = s.schedule(req, list(enumerate(blocks)), None, 16)
    assert blocks[out[0]] == max(blocks)
    assert [blocks[e] for e in out] == sorted(blocks, reverse=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.floats(0, 1), st.integers(0, 6),
                          st.integers(0, 8), st.integers(0, 5)), min_size=2, max_size=6),
       st.integers(0, 2**63))
def test_lora_affinity_leaves_base_model_decisions_as_they_were(eps, req):
    # best.yaml adds lora-affinity to prefix-cache + least-request: for a base-model request
    # it scores every endpoint alike, so the order (and the hot-spot guard) must not move
    # whatever the endpoints' adapters, slots and adapters in flight
    base = Scorer([], [("prefix-cache", 1), ("least-request", 1)])
    with_lora = Scorer([], [("prefix-cache", 1), ("least-request", 1), ("lora-affinity", 1)])
    matches = []
    for ep, (running, waiting, kv, in_flight, matched, loras) in enumerate(eps):
        for s in (base, with_lora):
            s.update_metrics(ep, running, waiting, kv)
            s.add_in_flight(ep, 0)
            for _ in range(in_flight):
                s.add_in_flight(ep, 1)
        with_lora.set_loras(ep, list(range(loras)), 2)
        for lora in range(loras):
            with_lora.add_lora_in_flight(ep, lora, 1)
        matches.append((ep, matched))
    assert base.schedule(req, matches, None, 8) == with_lora.schedule(req, matches, None, 8)
