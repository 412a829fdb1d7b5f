"""The PD benchmark's workload: long prompts, fixed outputs, Poisson arrivals per rate.

Each rate is one phase of `requests_per_rate` requests (or `duration_per_rate` simulated
seconds of arrivals). Every prompt is `prompt_len` tokens (chat template included) and
asks for `output_len` tokens, streamed. Two kinds of request:

- fresh (share 1 - followup_share): a new context of prompt_len tokens, nothing cached;
- follow-up (followup_share): it keeps an earlier request's context and asks something
  new: the parent's first prompt_len - u content tokens, then u new tokens, u drawn
  log-uniform in [followup_new_min, followup_new_max]. This is a conversation that keeps
  its history (truncated to the same length, so every prompt stays 4k): on the engine that
  served the parent, only ~u tokens are uncached, which is what conditional
  disaggregation (pd.minUncachedTokens) looks at. The parent is a fresh request of the
  same phase sent at least followup_min_gap_s (simulated) earlier; without one, the
  request is fresh.

Texts are words the simulator's tokenizer encodes as one token each (shared_prefix's
words), so token counts are exact. Everything is a function of (seed, phase).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from loadtest.shared_prefix.workload import _vocab_words, words_text

DEFAULT_RATES = (1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0)


@dataclass(frozen=True)
class WorkloadSpec:
    prompt_len: int = 4096  # tokens, chat template included
    output_len: int = 256
    rates: tuple[float, ...] = DEFAULT_RATES  # req/s of simulated time, rising
    requests_per_rate: int = 40
    duration_per_rate: float | None = None  # simulated s; set: n = ceil(rate x duration)
    followup_share: float = 0.4
    followup_new_min: int = 64
    followup_new_max: int = 2048
    followup_min_gap_s: float = 2.0
    seed: int = 1

    def requests_at(self, rate: float) -> int:
        if self.duration_per_rate is not None:
            return max(1, math.ceil(rate * self.duration_per_rate))
        return self.requests_per_rate

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Request:
    index: int
    offset_s: float  # simulated seconds after the phase's start
    words: tuple[str, ...] = field(repr=False)
    max_tokens: int
    parent: int | None  # index of the request whose context this one keeps
    new_tokens: int  # content tokens not shared with the parent (all for a fresh one)

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def chat_body(self, model: str) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": self.text}],
                "stream": True, "max_tokens": self.max_tokens}


@lru_cache(maxsize=1)
def template_tokens() -> int:
    """Tokens the chat template adds around one user message (the simulator's template)."""
    from loadtest.simulator.tokenizer import load_codec, render_chat

    codec = load_codec()
    one = codec.encode(render_chat([{"role": "user", "content": "x"}]))
    return len(one) - len(codec.encode("x"))


def generate_phase(spec: WorkloadSpec, rate: float, phase: int) -> list[Request]:
    """The requests of one rate, in send order, with their arrival offsets."""
    rng = random.Random(spec.seed * 1_000_003 + phase * 7919)
    content = spec.prompt_len - template_tokens()
    if content < 2:
        raise ValueError(f"prompt_len {spec.prompt_len} leaves no room for content")
    spaced = _vocab_words()[0]
    lo = max(1, min(spec.followup_new_min, content - 1))
    hi = max(lo, min(spec.followup_new_max, content - 1))
    out: list[Request] = []
    t = 0.0
    fresh: list[Request] = []
    for i in range(spec.requests_at(rate)):
        parents = [r for r in fresh if r.offset_s <= t - spec.followup_min_gap_s]
        if parents and rng.random() < spec.followup_share:
            parent = rng.choice(parents)
            u = min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
            words = parent.words[:content - u] + tuple(rng.choices(spaced, k=u))
            req = Request(i, t, words, spec.output_len, parent.index, u)
        else:
            req = Request(i, t, tuple(words_text(rng, content).split(" ")), spec.output_len,
                          None, content)
            fresh.append(req)
        out.append(req)
        t += rng.expovariate(rate)
    return out
