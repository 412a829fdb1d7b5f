"""Benchmarks of the Rust extension (kthena_router._core). Run with --benchmark-only."""

import orjson
import pytest

from kthena_router._core import splice_top_level

REPS = [(b"model", b'"meta-llama/Llama-3.1-8B-Instruct"'), (b"stream_options", b'{"include_usage":true}')]


def _chat_body(size: int) -> bytes:
    """A chat request of about `size` bytes: mostly message text, as real large bodies are."""
    n_msgs = 4
    per = max(1, size // n_msgs - 40)
    # Prose with newlines, a quoted word and a path: escapes as real prompts have them.
    line = 'The quick brown fox jumps over the "lazy" dog at C:\\tmp {x}, café.\n'
    text = (line * (per // len(line) + 1))[:per]
    body = {
        "model": "demo",
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(n_msgs)],
        "stream": True,
        "temperature": 0.7,
    }
    return orjson.dumps(body)


SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10, "16MiB": 16 << 20}


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_splice(benchmark, size):
    body = _chat_body(SIZES[size])
    out = benchmark(splice_top_level, body, REPS)
    assert orjson.loads(out)["model"] == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_orjson_roundtrip(benchmark, size):
    """Baseline: what splice replaces (parse, set fields, re-encode)."""
    body = _chat_body(SIZES[size])

    def roundtrip():
        d = orjson.loads(body)
        d["model"] = "meta-llama/Llama-3.1-8B-Instruct"
        d["stream_options"] = {"include_usage": True}
        return orjson.dumps(d)

    benchmark(roundtrip)


def test_bench_splice_token_ids_16mib(benchmark):
    """Worst case for the scanner: a huge nested array without strings (prompt token ids)."""
    body = orjson.dumps({"model": "demo", "prompt": list(range(100_000, 100_000 + 2_300_000)), "max_tokens": 1})
    out = benchmark(splice_top_level, body, REPS)
    assert out.endswith(b',"stream_options":{"include_usage":true}}')


# --- prefix-cache index --------------------------------------------------------------

import random  # noqa: E402

from kthena_router._core import PrefixIndex, prefix_hashes, prefix_seed  # noqa: E402

BLOCK, MAX_BLOCKS = 64, 128  # Kthena's defaults: blockSizeToHash, maxBlocksToMatch
N_EP, PER_EP, CHAIN = 100, 10_000, 100  # 100 endpoints x 10k entries = 1M entries
SEED = prefix_seed(b"demo", b"")


def _build_index(rng: random.Random) -> tuple[PrefixIndex, list[bytes]]:
    ix = PrefixIndex(PER_EP)
    prompts = []
    for ep in range(N_EP):
        for _ in range(PER_EP // CHAIN):
            p = rng.randbytes(BLOCK * CHAIN)
            prompts.append(p)
            ix.insert(ep, prefix_hashes(p, BLOCK, SEED, CHAIN))
    return ix, prompts


@pytest.fixture(scope="module")
def big_index():
    rng = random.Random(0)
    ix, prompts = _build_index(rng)
    assert len(ix) == N_EP * PER_EP
    # A 16 KiB prompt whose first 50 blocks are cached on 3 endpoints.
    shared = prompts[5][: 50 * BLOCK]
    for ep in (3, 40, 77):
        ix.insert(ep, prefix_hashes(shared, BLOCK, SEED, MAX_BLOCKS))
    prompt = shared + rng.randbytes(16 * 1024 - len(shared))
    return ix, prompt


def test_bench_prefix_match_16k_prompt(benchmark, big_index):
    """Hash + match of a 16 KiB prompt, 1M entries over 100 endpoints, Kthena defaults."""
    ix, prompt = big_index
    hashes, matches = benchmark(ix.match_prompt, prompt, BLOCK, SEED, MAX_BLOCKS)
    assert len(hashes) == MAX_BLOCKS
    # Endpoint 0 holds the source chain (prompts[5]) too.
    assert {ep: n for ep, n in matches if n >= 50} == {0: 50, 3: 50, 40: 50, 77: 50}


def test_bench_prefix_match_16k_prompt_all_blocks(benchmark, big_index):
    """Same, hashing all 256 blocks of the prompt (maxBlocksToMatch >= 256)."""
    ix, prompt = big_index
    hashes, _ = benchmark(ix.match_prompt, prompt, BLOCK, SEED, 1 << 20)
    assert len(hashes) == 256


def test_bench_prefix_match_miss(benchmark, big_index):
    ix, prompt = big_index
    other = bytes(reversed(prompt))
    _, matches = benchmark(ix.match_prompt, other, BLOCK, SEED, MAX_BLOCKS)
    assert matches == []


def test_bench_prefix_insert_touch(benchmark, big_index):
    """Recording ownership at dispatch when the endpoint already holds the 128-block chain."""
    ix, prompt = big_index
    hashes, _ = ix.match_prompt(prompt, BLOCK, SEED, MAX_BLOCKS)
    ix.insert(3, hashes)
    benchmark(ix.insert, 3, hashes)
    assert ix.endpoint_len(3) == PER_EP


def test_bench_prefix_insert_new_chain_full_endpoint(benchmark, big_index):
    """Worst case at dispatch: 128 new blocks into a full endpoint (128 LRU evictions of
    cold entries)."""
    ix, _ = big_index
    rng = random.Random(2)
    rounds = 2000
    chains = iter([prefix_hashes(rng.randbytes(BLOCK * MAX_BLOCKS), BLOCK, SEED, MAX_BLOCKS) for _ in range(rounds)])
    eps = iter(range(rounds))
    benchmark.pedantic(ix.insert, setup=lambda: ((next(eps) % N_EP, next(chains)), {}), rounds=rounds)
    assert len(ix) == N_EP * PER_EP


_RSS_SCRIPT = """
import gc, os, random
from kthena_router._core import PrefixIndex, prefix_hashes, prefix_seed
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
rng, seed = random.Random(1), prefix_seed(b"demo", b"")
gc.collect(); before = rss()
ix = PrefixIndex(%(per)d)
for ep in range(%(n_ep)d):
    for _ in range(%(per)d // %(chain)d):
        ix.insert(ep, prefix_hashes(rng.randbytes(%(block)d * %(chain)d), %(block)d, seed, %(chain)d))
gc.collect()
print(len(ix), rss() - before, ix.memory_bytes())
"""


def test_prefix_index_memory_1m_entries(benchmark):
    """Bytes per (block, endpoint) entry at 1M entries: RSS delta in a fresh process (so
    freed memory of other benchmarks is not reused) and the index's own size accounting."""
    import subprocess
    import sys

    script = _RSS_SCRIPT % {"per": PER_EP, "n_ep": N_EP, "chain": CHAIN, "block": BLOCK}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    n, rss_delta, accounted = map(int, out.split())
    assert n == N_EP * PER_EP
    benchmark.extra_info["accounted_bytes_per_entry"] = round(accounted / n, 1)
    benchmark.extra_info["rss_bytes_per_entry"] = round(rss_delta / n, 1)
    print(f"\nprefix index, {n} entries: {accounted / n:.1f} B/entry accounted, {rss_delta / n:.1f} B/entry RSS delta")
    # The timed part is only the accounting call; the figures above are the point.
    benchmark(PrefixIndex(1).memory_bytes)
    assert accounted / n <= 64 and rss_delta / n <= 64
