"""kvcache-aware per-request cost: tokens -> vLLM sha256_cbor block hashes -> ownership match
(one Rust call, `KvOwnership.match_tokens`), 4k and 100k-token prompts against 100
endpoints, without and with the digest memo warm; and the whole matcher path (chat
template + cached tokenization + match) for a prompt extending a cached one (warm) and
for a new prompt (cold: nothing cached). Tokenization alone (cold / with the prefix
cache): tests/bench/test_bench_tokenize.py. Run with --benchmark-only."""

from __future__ import annotations

import itertools
import random
from array import array
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry

from tokenizers import Tokenizer

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


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_kv_match_tokens_memo(benchmark, table, size):
    """As above with the digest memo warm (the prompt's blocks were hashed before)."""
    _, prompts = table
    t = KvOwnership(1 << 20, "vllm-sha256-cbor", "0", hash_memo_blocks=1 << 16)
    tokens = array("I", prompts[size])
    first = t.match_tokens(tokens, BS, 0, 1 << 20)
    assert benchmark(t.match_tokens, tokens, BS, 0, 1 << 20) == first
    assert t.hash_memo_stats()[2] >= SIZES[size] // BS


def _system_prompt(n_tokens: int) -> str:
    """Random words (the BPE word cache helps as little as on real prompts) making about
    n_tokens tokens with the simulator's tokenizer (~5 tokens per word: random letters)."""
    rng = random.Random(n_tokens)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(20_000)]
    tok = Tokenizer.from_file(str(TOKENIZER))
    words = [rng.choice(vocab) + rng.choice((" ", " ", ", ", ".\n")) for _ in range(n_tokens // 4)]
    while True:
        got = len(tok.encode("".join(words), add_special_tokens=False).ids)
        if abs(got - n_tokens) <= n_tokens // 100:
            return "".join(words)
        want = max(1, len(words) * n_tokens // got)
        words = words[:want] + [rng.choice(vocab) + " " for _ in range(want - len(words))]


def _matcher() -> KvAwareMatcher:
    args = KvCacheAwareArgs(tokenizers=MappingProxyType({"demo": str(TOKENIZER)}))
    m = KvAwareMatcher(args, RouterMetrics(CollectorRegistry()))
    m.ids = {f"e{i}": i for i in range(ENDPOINTS)}  # no subscriptions: every stream is up
    return m


def _chat(system: str, question: str) -> RequestInfo:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    return RequestInfo("r", "/v1/chat/completions", body, "demo", "", "demo")


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_kv_matcher_request_warm(benchmark, size):
    """The matcher's whole request path for a chat request whose long system prompt was seen
    before (tokenizer prefix cache and digest memo warm), a new question each time:
    template render + tokenize + hash + match against 100 endpoints. The prompt has about
    `size` tokens."""
    m = _matcher()
    system = _system_prompt(SIZES[size])
    counter = itertools.count()
    m.match(_chat(system, "first question?"), None, 0)  # warms the caches
    matches, n = benchmark(lambda: m.match(_chat(system, f"question number {next(counter)}?"), None, 0))
    assert SIZES[size] // BS * 9 // 10 <= n <= SIZES[size] // BS * 11 // 10 and matches == []


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_kv_matcher_request_cold(benchmark, size):
    """As above for a prompt nothing is cached for (its first characters differ): the
    whole prompt is tokenized and hashed."""
    m = _matcher()
    system = _system_prompt(SIZES[size])
    counter = itertools.count()
    matches, n = benchmark(lambda: m.match(_chat(f"{next(counter)} {system}", "a question?"), None, 0))
    assert SIZES[size] // BS * 9 // 10 <= n <= SIZES[size] // BS * 11 // 10 and matches == []
    stats = m.tokenizers.get("demo").stats  # type: ignore[union-attr]
    assert stats.tail_hits == 0 and stats.chunk_hits == 0
