"""How many entries the approximate prefix index keeps per endpoint.

The index stores one entry per `block_size_to_hash` bytes of prompt; the engine caches
tokens. To mirror an engine's cache the index needs the engine's KV tokens converted to
prompt bytes, and bytes per token is a property of the traffic, not a constant (English
chat, CJK text and synthetic prompts differ several-fold). A fixed guess makes the router
believe prefixes gone that are still cached (or the reverse), so the ratio is learned from
the engines' own usage reports (prompt_tokens) against the bytes the router hashed
(figures in docs/benchmarks.md).

HEADROOM: the index remembers a prefix somewhat longer than the engine keeps it. When a
prefix was evicted, the next request of its group still goes where the group was served
(one re-prefill there, the partition stays stable) instead of scattering to the least
loaded engine (docs/benchmarks.md compares this with exact KV events, which forget at
eviction). Memory: ~36 B per entry.
"""

from __future__ import annotations

import math

PRIOR_BYTES_PER_TOKEN = 4.0  # before any usage report (English text with a BPE tokenizer)
PRIOR_WEIGHT_TOKENS = 4096.0  # the prior counts as this many observed tokens
DECAY = 0.999  # per report: the estimate follows the last ~thousand requests
RESIZE_STEP = 0.10  # re-apply capacities when the estimate moved this much (relative)
HEADROOM = 2.0
# Bounds of the estimate in use: a misreporting engine (or a template adding bytes but
# no tokens) can skew the sizes a client cannot see, but not collapse or explode them.
MIN_BYTES_PER_TOKEN, MAX_BYTES_PER_TOKEN = 1.0, 32.0


class IndexSizer:
    """Bytes-per-token estimate from (prompt bytes, engine prompt tokens) pairs and the
    per-endpoint capacity it implies. Pure arithmetic; the scheduler applies the result."""

    __slots__ = ("block_bytes", "_bytes", "_tokens", "applied")

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self._bytes = PRIOR_BYTES_PER_TOKEN * PRIOR_WEIGHT_TOKENS
        self._tokens = PRIOR_WEIGHT_TOKENS
        self.applied = PRIOR_BYTES_PER_TOKEN  # the ratio the current capacities use

    @property
    def bytes_per_token(self) -> float:
        return min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, self._bytes / self._tokens))

    def observe(self, prompt_bytes: int, prompt_tokens: int) -> bool:
        """One request's sizes; True when capacities should be recomputed (the estimate
        moved more than RESIZE_STEP from the applied one)."""
        if prompt_bytes <= 0 or prompt_tokens <= 0:
            return False
        self._bytes = self._bytes * DECAY + prompt_bytes
        self._tokens = self._tokens * DECAY + prompt_tokens
        return abs(self.bytes_per_token / self.applied - 1.0) > RESIZE_STEP

    def capacity(self, kv_tokens: int) -> int:
        """Entries per endpoint for an engine caching `kv_tokens` tokens (at the estimate
        in use, `applied`)."""
        return max(1, math.ceil(kv_tokens * self.applied * HEADROOM / self.block_bytes))

    def apply(self) -> None:
        self.applied = self.bytes_per_token
