"""Pairing: the decode endpoint first (decode-side plugins), then a prefill endpoint of its
group (prefill-side plugins). CONTRACT STUB: round-robin on both sides; replaced by the
Rust-scored pairing (issue 10)."""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

from kthena_router.endpoints.registry import EndpointState

from .config import PdServerSettings
from .topology import PdTopology

__all__ = ["PdPair", "PdPairer"]


class PdPair(NamedTuple):
    decode: EndpointState
    prefill: EndpointState | None  # None: conditional disaggregation sends the request to decode alone
    group: str


class PdPairer:
    """Per worker. `pairs` is the hot path: candidate pairs, best first (the dispatcher moves
    to the next pair on a failure before the first byte reaches the client)."""

    def __init__(self) -> None:
        self._rr = itertools.count()

    async def prepare(self, info: Any) -> None:
        """Blocking work (tokenizing) before pairs(), off the loop."""

    def pairs(self, topo: PdTopology, info: Any, settings: PdServerSettings) -> list[PdPair]:
        if not topo.decode:
            return []
        n = next(self._rr)
        decode = topo.decode[n:] + topo.decode[:n] if (n := n % len(topo.decode)) else list(topo.decode)
        out: list[PdPair] = []
        for d in decode:
            g = topo.groups[topo.group_of[d.key]]
            p = g.prefill[n % len(g.prefill)]
            out.append(PdPair(d, p, g.name))
        return out

    def dispatched(self, ep: EndpointState, info: Any, side: str) -> None:
        """An attempt on `ep` started; side is "prefill" or "decode"."""

    def finished(self, ep: EndpointState, side: str, ttft_s: float | None = None,
                 tpot_s: float | None = None) -> None:
        """The attempt on `ep` ended."""

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        """The engine reported the prompt size (usage.prompt_tokens)."""
