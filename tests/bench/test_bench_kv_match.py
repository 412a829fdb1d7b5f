"""kvcache-aware per-request cost: tokens -> vLLM sha256_cbor block hashes -> ownership match
(one Rust call, `KvOwnership.match_tokens`), 4k and 100k-token prompts against 100
endpoints; and the whole matcher path (chat template + cached tokenization + match).
Tokenization alone (cold / with the prefix cache): tests/bench/test_bench_tokenize.py.
Run with --benchmark-only."""

from __future__ import annotations

import itertools
import random
from array import array
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry

from kthena_router._core import KvOwnership, token_block_hashes
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.config import KvCacheAwareArgs
from kthena_router.scheduling.kv_matcher import KvAwareMatcher
from kthena_router.scheduling.request import RequestInfo

TOKENIZER = Path(__file__).resolve().parents[2] / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
SIZES = {"4k": 4_096, "100k": 100_000}
ENDPOINTS = 100
BS = 16


def _hashes(tokens: list[int]) -> list[int]:
    return token_block_hashes(tokens, BS, 0, 1 << 20, "vllm-sha256-cbor")


@pytest.fixture(scope="module")
def table() -> tuple[KvOwnership, dict[str, list[int]]]:
    """100 endpoints, each holding its own 4k-token document plus, for endpoint e, the
    first (e+1)% of the 100k-token prompt (so every endpoint matches a different length)."""
    rng = random.Random(5)
    t = KvOwnership(1 << 20, "vllm-sha256-cbor", "0")
    prompts = {k: [rng.randrange(128_000) for _ in range(n)] for k, n in SIZES.items()}
    big = _hashes(prompts["100k"])
    for ep in range(ENDPOINTS):
        t.stored(ep, _hashes([rng.randrange(128_000) for _ in range(4096)]))
        t.stored(ep, big[: len(big) * (ep + 1) // ENDPOINTS])
    t.stored(7, _hashes(prompts["4k"])[:128])
    return t, prompts


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_kv_match_tokens(benchmark, table, size):
    """One PyO3 call: u32 buffer in, hashes + match out (GIL released above 8k tokens)."""
    t, prompts = table
    tokens = array("I", prompts[size])
    n, matches = benchmark(t.match_tokens, tokens, BS, 0, 1 << 20)
    assert n == SIZES[size] // BS
    m = dict(matches)
    if size == "4k":
        assert m == {7: 128}
    else:
        assert len(m) == ENDPOINTS and m[ENDPOINTS - 1] == n


def _text(n_words: int) -> str:
    rng = random.Random(n_words)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(20_000)]
    return "".join(rng.choice(vocab) + rng.choice((" ", " ", ", ", ".\n")) for _ in range(n_words))


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_kv_matcher_request_warm(benchmark, size):
    """The matcher's whole request path for a chat request whose long system prompt was seen
    before (tokenizer prefix cache warm), a new question each time: template render +
    tokenize + hash + match against 100 endpoints."""
    args = KvCacheAwareArgs(tokenizers=MappingProxyType({"demo": str(TOKENIZER)}))
    m = KvAwareMatcher(args, RouterMetrics(CollectorRegistry()))
    m.ids = {f"e{i}": i for i in range(ENDPOINTS)}  # no subscriptions: every stream is up
    system = _text(SIZES[size] * 2 // 3)  # ~1.4 tokens per word with this tokenizer
    counter = itertools.count()

    def info() -> RequestInfo:
        body = {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"question number {next(counter)}?"}]}
        return RequestInfo("r", "/v1/chat/completions", body, "demo", "", "demo")

    m.match(info(), None, 0)  # warms the tokenizer cache
    matches, n = benchmark(lambda: m.match(info(), None, 0))
    assert n >= SIZES[size] // BS * 8 // 10 and matches == []
