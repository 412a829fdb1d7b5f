"""Local tokenization per request (kvcache-aware): 4k and 100k-token prompts, cold
(no prefix cache) and warm (a shared prefix already cached, a new question at the end).
Uses the simulator's shipped tokenizer.json (a 32k-vocab ByteLevel BPE). Run with
--benchmark-only."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kthena_router.scheduling.tokenizer_cache import CachedTokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
TOKENS = {"4k": 4_000, "100k": 100_000}


def _text(tok: Tokenizer, n_tokens: int) -> str:
    """Varied prose of about n_tokens tokens (random words, so the BPE word cache helps as
    little as it does on real prompts)."""
    rng = random.Random(n_tokens)
    vocab = [w for w in ("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                         for _ in range(20_000))]
    words: list[str] = []
    text = ""
    while True:
        words.extend(rng.choice(vocab) + rng.choice((" ", " ", " ", ", ", ".\n")) for _ in range(n_tokens // 2))
        text = "".join(words)
        if len(tok.encode(text, add_special_tokens=False).ids) >= n_tokens:
            return text


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


@pytest.mark.parametrize("size", list(TOKENS), ids=list(TOKENS))
def test_bench_tokenize_cold(benchmark, tok, size):
    """No reuse: every request a new prompt (the cache's bookkeeping included)."""
    text = _text(tok, TOKENS[size])
    cached = CachedTokenizer(Tokenizer.from_file(str(TOKENIZER)))
    counter = itertools.count()

    def run():
        # a different first character each time: no chunk hit, like an unrelated prompt
        return cached.encode(f"{next(counter)} " + text, True)

    ids = benchmark(run)
    assert len(ids) >= TOKENS[size]


@pytest.mark.parametrize("size", list(TOKENS), ids=list(TOKENS))
def test_bench_tokenize_plain(benchmark, tok, size):
    """Baseline: Tokenizer.encode of the whole prompt, no cache."""
    text = _text(tok, TOKENS[size])
    ids = benchmark(lambda: tok.encode(text, add_special_tokens=True).ids)
    assert len(ids) >= TOKENS[size]


@pytest.mark.parametrize("size", list(TOKENS), ids=list(TOKENS))
def test_bench_tokenize_warm(benchmark, tok, size):
    """The prompt minus its last ~100 tokens is a cached prefix; a new question follows."""
    text = _text(tok, TOKENS[size])
    shared = text[: len(text) - 400]
    cached = CachedTokenizer(Tokenizer.from_file(str(TOKENIZER)))
    cached.encode(shared + "first question?", True)
    counter = itertools.count()

    def run():
        return cached.encode(shared + f" question number {next(counter)}?", True)

    ids = benchmark(run)
    q = shared + " question number 0?"
    assert cached.encode(q, True).tolist() == tok.encode(q, add_special_tokens=True).ids
    assert len(ids) >= TOKENS[size] - 200 and cached.stats.resync_failures == 0
