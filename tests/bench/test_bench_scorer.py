"""Benchmarks of the scheduling decision (kthena_router._core.Scorer). Run with --benchmark-only.

Targets (issue 3): a full decision with all plugins over 100 endpoints <= 20 us median,
over 1,000 endpoints <= 100 us; the figures are reported, not asserted (no wall-clock
assertions in tests).
"""

import random

import pytest

from kthena_router._core import KvOwnership, Scorer

ALL_FILTERS = ["least-request", "lora-affinity"]
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
ARGS = {
    "least-request": {"maxWaitingRequests": 10},
    "least-latency": {"TTFTTPOTWeightFactor": 0.5},
    "prefix-cache": {"blockSizeToHash": 64, "maxBlocksToMatch": 128, "maxHashCacheSize": 50000},
}


def _scorer(n: int, rng: random.Random) -> Scorer:
    s = Scorer(ALL_FILTERS, ALL_SCORES, ARGS)
    for ep in range(n):
        s.update_metrics(ep, rng.randint(0, 40), rng.randint(0, 12), rng.random(), rng.uniform(0.05, 2), rng.uniform(0.005, 0.05))
        s.add_in_flight(ep, rng.randint(0, 5))
        s.set_loras(ep, rng.sample(range(20), 3), 4)
        if rng.random() < 0.05:
            s.mark_stale(ep)
    return s


@pytest.mark.parametrize("n", [100, 1000], ids=["100eps", "1000eps"])
@pytest.mark.parametrize("lora", [None, 3], ids=["base", "lora"])
def test_bench_schedule_all_plugins(benchmark, n, lora):
    """One full decision: 2 filters, 8 score plugins, guard, 8 prefix matches, whole
    ordered list returned to Python."""
    rng = random.Random(n)
    s = _scorer(n, rng)
    matches = [(rng.randrange(n), rng.randint(1, 128)) for _ in range(8)]
    hashes = iter(range(10**9))

    out = benchmark(lambda: s.schedule(next(hashes), matches, lora, 128))
    assert len(out) == len(set(out)) and len(out) >= 1
    benchmark.extra_info["endpoints"] = n


def test_bench_schedule_1000_top8(benchmark):
    """Same over 1,000 endpoints, returning only the 8 best (failover needs few)."""
    rng = random.Random(7)
    s = Scorer(ALL_FILTERS, ALL_SCORES, ARGS, max_candidates=8)
    base = _scorer(1000, rng)  # same signals, built once
    for ep in base.endpoints():
        sig = base.signals(ep)
        s.update_metrics(ep, sig["running"], sig["waiting"], sig["kv_usage"], sig["ttft_s"], sig["tpot_s"])
    matches = [(rng.randrange(1000), rng.randint(1, 128)) for _ in range(8)]
    hashes = iter(range(10**9))
    out = benchmark(lambda: s.schedule(next(hashes), matches, None, 128))
    assert len(out) == 8


def test_bench_kv_match_tokens_4k(benchmark):
    """Hash 4k tokens (xxh3 scheme, 16-token blocks) and match against 100 endpoints x 10k blocks."""
    rng = random.Random(3)
    t = KvOwnership(10_000)
    for ep in range(100):
        t.stored(ep, [rng.getrandbits(64) for _ in range(10_000)])
    tokens = [rng.randrange(128_000) for _ in range(4096)]
    from kthena_router._core import token_block_hashes

    t.stored(42, token_block_hashes(tokens[:2048], 16, 1, 1000))
    n, matches = benchmark(t.match_tokens, tokens, 16, 1, 1000)
    assert n == 256 and dict(matches)[42] == 128
