"""The generated-shared-prefix workload (SGLang bench_serving's `generated-shared-prefix`).

`num_groups` groups, each with one system prompt of `system_prompt_len` tokens shared by
`prompts_per_group` requests, each adding its own question of `question_len` tokens and
asking for `output_len` tokens. Requests go out in a seeded random order (all groups
interleaved, as a busy service sees them), at Poisson arrivals of `request_rate` per
second (inf: all at once), with at most `max_concurrency` in flight.

Texts are made of words that the simulator's tokenizer (loadtest/simulator/tokenizer)
encodes as one token each with their leading space, so a text of n words is n tokens
(the first word may take one more). Everything is a function of the seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from loadtest.simulator.tokenizer import TOKENIZER_PATH


@dataclass(frozen=True)
class WorkloadSpec:
    num_groups: int = 256
    prompts_per_group: int = 32
    system_prompt_len: int = 4096  # tokens
    question_len: int = 256  # tokens
    output_len: int = 128  # tokens (max_tokens)
    request_rate: float = 800.0  # req/s of simulated time; inf = all at once
    max_concurrency: int = 300
    seed: int = 1

    @property
    def num_requests(self) -> int:
        return self.num_groups * self.prompts_per_group

    @property
    def distinct_prefix_tokens(self) -> int:
        return self.num_groups * self.system_prompt_len

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["request_rate"] = None if math.isinf(self.request_rate) else self.request_rate
        return d


# The published setup (Kthena blog, long system prompt) and scaled-down profiles. The
# scaled ones keep the published ratios: prompt shape (4096 + 256 -> 128), concurrency
# and request rate per group (300/256, 800/256), and, through the runner's KV scaling by
# distinct prefix tokens, prefix-vs-KV and running-KV-vs-KV. What shrinks: group count,
# prompts per group (so a larger share of compulsory misses) and the batch per engine.
PROFILES: dict[str, WorkloadSpec] = {
    "published": WorkloadSpec(),
    "small": WorkloadSpec(num_groups=128, prompts_per_group=16, request_rate=400.0,
                          max_concurrency=150),
    "ci": WorkloadSpec(num_groups=64, prompts_per_group=8, request_rate=200.0,
                       max_concurrency=75),
    # seconds-long, for the smoke test: shorter prompts so that it stays cheap
    "tiny": WorkloadSpec(num_groups=8, prompts_per_group=6, system_prompt_len=1024,
                         question_len=64, output_len=16, max_concurrency=24),
}


def profile(name: str, **overrides: Any) -> WorkloadSpec:
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class Request:
    index: int  # position in the send order
    group: int
    system: str  # the group's system prompt
    question: str
    max_tokens: int

    def chat_body(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": [{"role": "system", "content": self.system},
                         {"role": "user", "content": self.question}],
            "stream": True,
            "max_tokens": self.max_tokens,
        }


@lru_cache(maxsize=1)
def _vocab_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(words that are one token after a space, those also one token without it)."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(TOKENIZER_PATH)).get_vocab()
    # "Ġ" is the byte-level BPE's space marker
    spaced = sorted(w[1:] for w in vocab
                    if w.startswith("Ġ") and len(w) > 2 and w[1:].isascii()
                    and w[1:].isalpha() and w[1:].islower())
    return tuple(spaced), tuple(w for w in spaced if w in vocab)


def words_text(rng: random.Random, n_tokens: int) -> str:
    """n_tokens words; the first one is one token even at the start of a message."""
    spaced, bare = _vocab_words()
    return " ".join([rng.choice(bare), *rng.choices(spaced, k=n_tokens - 1)])


def generate(spec: WorkloadSpec) -> list[Request]:
    """All requests of the workload, in send order."""
    rng = random.Random(spec.seed)
    systems = [words_text(rng, spec.system_prompt_len) for _ in range(spec.num_groups)]
    pairs = [(g, words_text(rng, spec.question_len))
             for g in range(spec.num_groups) for _ in range(spec.prompts_per_group)]
    rng.shuffle(pairs)
    return [Request(i, g, systems[g], q, spec.output_len) for i, (g, q) in enumerate(pairs)]


def arrival_times(spec: WorkloadSpec, n: int | None = None) -> list[float]:
    """Send offsets in simulated seconds (exponential gaps; all 0 for an infinite rate)."""
    n = spec.num_requests if n is None else n
    if math.isinf(spec.request_rate):
        return [0.0] * n
    rng = random.Random(spec.seed * 7919 + 1)  # independent of the texts' stream
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(spec.request_rate)
    return out
