"""The prefix index's hot paths with evicted-owner hints on (prefix-cache's
evictedHintSlots): match and dispatch-time insert, next to test_bench_core.py's figures
for the same index without hints. Assertions check results only, never times."""

from __future__ import annotations

import random

import pytest

from kthena_router._core import PrefixIndex, prefix_hashes, prefix_seed

BLOCK, MAX_BLOCKS = 64, 128
N_EP, PER_EP, CHAIN = 100, 10_000, 100  # 1M entries, as test_bench_core.py
HINT_SLOTS = 65_536
SEED = prefix_seed(b"demo", b"")


@pytest.fixture(scope="module")
def hinted_index():
    rng = random.Random(0)
    ix = PrefixIndex(PER_EP, hint_slots=HINT_SLOTS)
    prompts = []
    for ep in range(N_EP):
        for _ in range(PER_EP // CHAIN):
            p = rng.randbytes(BLOCK * CHAIN)
            prompts.append(p)
            ix.insert(ep, prefix_hashes(p, BLOCK, SEED, CHAIN))
    assert len(ix) == N_EP * PER_EP
    # Endpoint 7 served a 128-block prompt, then 100 more chains pushed it out of its index.
    evicted = rng.randbytes(BLOCK * MAX_BLOCKS)
    ix.insert(7, prefix_hashes(evicted, BLOCK, SEED, MAX_BLOCKS))
    for _ in range(PER_EP // CHAIN):
        ix.insert(7, prefix_hashes(rng.randbytes(BLOCK * CHAIN), BLOCK, SEED, CHAIN))
    return ix, prompts[5] + rng.randbytes(16 * 1024 - BLOCK * CHAIN), evicted


def test_bench_hinted_match_16k_prompt(benchmark, hinted_index):
    """Hash + match of a 16 KiB prompt the index holds on one endpoint (no hint applies)."""
    ix, prompt, _ = hinted_index
    hashes, matches = benchmark(ix.match_prompt, prompt, BLOCK, SEED, MAX_BLOCKS)
    assert len(hashes) == MAX_BLOCKS
    assert dict(matches) == {0: CHAIN}


def test_bench_hinted_match_evicted_prompt(benchmark, hinted_index):
    """Hash + match of a prompt only the hints know: a discounted run on its last owner."""
    ix, _, evicted = hinted_index
    _, matches = benchmark(ix.match_prompt, evicted, BLOCK, SEED, MAX_BLOCKS)
    got = dict(matches)
    assert set(got) == {7} and 0 < got[7] < MAX_BLOCKS, got


def test_bench_hinted_insert_new_chain_full_endpoint(benchmark, hinted_index):
    """Worst case at dispatch: 128 new blocks into a full endpoint, each eviction written
    to the hint table."""
    ix, _, _ = hinted_index
    rng = random.Random(2)
    rounds = 2000
    chains = iter([prefix_hashes(rng.randbytes(BLOCK * MAX_BLOCKS), BLOCK, SEED, MAX_BLOCKS) for _ in range(rounds)])
    eps = iter(range(rounds))
    benchmark.pedantic(ix.insert, setup=lambda: ((next(eps) % N_EP, next(chains)), {}), rounds=rounds)
    assert len(ix) == N_EP * PER_EP
    assert ix.memory_bytes() >= HINT_SLOTS * 16
