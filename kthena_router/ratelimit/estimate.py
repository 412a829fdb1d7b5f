"""Input tokens of a request before the engine counts them: body bytes / learned bytes per token.

The ratio is learned per route from the engines' own usage.prompt_tokens against the body
length (JSON and chat-template overhead included, so it is not the tokenizer's ratio). A
reservation made with it is settled to the real count afterwards, so the estimate only
decides who gets in at the edge of a budget; it learns fast (the last ~100 requests).
"""

from __future__ import annotations

import math

PRIOR_BYTES_PER_TOKEN = 4.0
PRIOR_WEIGHT = 64.0  # the prior counts as this many tokens
DECAY = 0.99  # per observation
MIN_RATIO, MAX_RATIO = 1.0, 32.0


class TokenEstimator:
    __slots__ = ("_bytes", "_tokens", "ratio")

    def __init__(self) -> None:
        self._bytes = PRIOR_BYTES_PER_TOKEN * PRIOR_WEIGHT
        self._tokens = PRIOR_WEIGHT
        self.ratio = PRIOR_BYTES_PER_TOKEN

    def estimate(self, body_bytes: int) -> int:
        return math.ceil(body_bytes / self.ratio) if body_bytes > 0 else 0

    def observe(self, body_bytes: int, prompt_tokens: int) -> None:
        if body_bytes <= 0 or prompt_tokens <= 0:
            return
        self._bytes = self._bytes * DECAY + body_bytes
        self._tokens = self._tokens * DECAY + prompt_tokens
        self.ratio = min(MAX_RATIO, max(MIN_RATIO, self._bytes / self._tokens))
