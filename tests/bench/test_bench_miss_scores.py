"""prefix-cache's balanceMisses on the hot path: the index's `miss_scores` (a pass over
the prefix keys its traffic counters remember) and the insert that feeds them. The worst
case is traffic where every request brings a new prefix key (unique short chats): the
counters then hold every key of the last few thousand dispatches. Assertions check
results only, never times."""

from __future__ import annotations

import random

import pytest

from kthena_router._core import PrefixIndex, prefix_hashes, prefix_seed

BLOCK, CHAIN = 64, 32
SEED = prefix_seed(b"demo", b"")


def traffic_index(n_ep: int, dispatches: int, groups: int | None) -> tuple[PrefixIndex, list[int]]:
    """`dispatches` inserts spread over `n_ep` endpoints; `groups` prefix groups (None:
    every dispatch a new key)."""
    rng = random.Random(n_ep)
    ix = PrefixIndex(100_000, traffic_block_bytes=BLOCK)
    heads = [rng.randbytes(BLOCK * 8) for _ in range(groups or 0)]
    for i in range(dispatches):
        head = heads[i % groups] if groups else rng.randbytes(BLOCK * 8)
        ix.insert(rng.randrange(n_ep) if not groups else (i % groups) % n_ep,
                  prefix_hashes(head + rng.randbytes(BLOCK * (CHAIN - 8)), BLOCK, SEED, CHAIN))
    return ix, list(range(n_ep))


@pytest.mark.parametrize("n_ep", [3, 16])
def test_bench_miss_scores_unique_keys(benchmark, n_ep):
    """Every dispatch a new key: ~2,000 keys remembered (the counters forget a key after
    ~4 windows of other dispatches)."""
    ix, ids = traffic_index(n_ep, 3000, None)
    scores = benchmark(ix.miss_scores, ids, CHAIN)
    assert scores and all(0 <= b <= CHAIN for _, b in scores)
    assert len(scores) < n_ep  # the most loaded endpoint is left out


def test_bench_miss_scores_grouped():
    """32 groups round-robin over 3 endpoints (11 / 11 / 10): the lightest scores highest,
    by about its 1/11 less load."""
    ix, ids = traffic_index(3, 3000, 32)
    scores = dict(ix.miss_scores(ids, CHAIN))
    assert max(scores, key=scores.__getitem__) == 2 and 1 <= scores[2] <= 5, scores


def test_bench_insert_with_traffic(benchmark):
    """The dispatch-time insert with the counters on (test_bench_core.py has it without)."""
    ix, _ = traffic_index(3, 1000, 32)
    rng = random.Random(5)
    chains = [prefix_hashes(rng.randbytes(BLOCK * CHAIN), BLOCK, SEED, CHAIN) for _ in range(64)]
    it = iter(range(10**9))
    benchmark(lambda: ix.insert(next(it) % 3, chains[next(it) % 64]))
    assert len(ix) > 0
