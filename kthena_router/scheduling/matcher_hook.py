"""The scheduler's hook for exact prefix matching from the engines' KV events: what it needs
of a matcher (scheduling/kv_matcher.py implements it), kept apart so the scheduler does not
depend on the matcher's machinery."""

from __future__ import annotations

from typing import Protocol

from .request import RequestInfo


class KvAwareMatcher(Protocol):
    """Hook for the exact `kvcache-aware` plugin (KV events). Returns (matches, total
    blocks) where matches are [(endpoint id, matched blocks)] from the engines' true cache,
    merged with `approx` for endpoints whose event stream is down; None = unavailable
    (the scheduler then uses `approx`, i.e. prefix-cache behaviour). The matcher counts
    its fallbacks in kthena_router_kvcache_aware_fallback_total itself (scheduling/kv_matcher.py)."""

    sourced: frozenset[int]  # endpoint ids with an event stream (subscribed)
    generation: int  # bumped when `sourced` changes

    async def prepare(self, info: RequestInfo) -> None: ...

    def match(self, info: RequestInfo, approx: list[tuple[int, int]] | None,
              approx_total: int) -> tuple[list[tuple[int, int]], int] | None: ...
