"""How much of the prefix the router's index credits an engine with the engine still holds.

The index inserts every prompt it dispatches and ages entries out by the engine's whole KV
capacity; the engine evicts sooner, since its running requests (their growing outputs
included) take blocks the index thinks hold cached prefixes. Per endpoint, this compares
the hits the index predicted for the dispatches there (matched blocks over the prompt's
blocks) with the hit rate the engine reports (vllm:prefix_cache_hits / queries, or
SGLang's cache_hit_rate) over the same scrape intervals:

    realization = sum(reported rate * dispatched blocks) / sum(predicted hit blocks)

clamped to 1 (an engine that also serves hits the index did not predict, such as cached
reply tokens or other routers' traffic, holds at least what it is credited with).
Rates, not counts, are compared, so the pod's other router workers' traffic on the same
engine does not skew one worker's figure. Sums decay per scrape: a request is dispatched
in one interval and may be prefilled in the next. Pure bookkeeping; prefill-cost's
`realizedPrefix` consumes the figure (Scorer.set_realization).
"""

from __future__ import annotations

_NAN = float("nan")

# Per scrape: the previous intervals' weight. About five intervals of memory, enough to
# cover the lag from dispatch to prefill under load without hiding a change for long.
DECAY = 0.8


class HitRealization:
    __slots__ = ("_interval", "_sums")

    def __init__(self) -> None:
        self._interval: dict[int, list[float]] = {}  # endpoint -> [predicted hit blocks, blocks]
        self._sums: dict[int, list[float]] = {}  # endpoint -> [decayed predicted, decayed reported]

    def dispatched(self, ep_id: int, hit_blocks: float, total_blocks: float) -> None:
        """A request of `total_blocks` prompt blocks, `hit_blocks` of them matched there, went to `ep_id`."""
        if total_blocks <= 0:
            return
        acc = self._interval.get(ep_id)
        if acc is None:
            self._interval[ep_id] = [max(0.0, hit_blocks), total_blocks]
        else:
            acc[0] += max(0.0, hit_blocks)
            acc[1] += total_blocks

    def scraped(self, ep_id: int, reported_rate: float | None) -> float:
        """The engine's hit rate over the interval just scraped (None: not reported, or the
        scrape failed); returns the realization, NaN while unmeasured."""
        if reported_rate is None:
            return self.realization(ep_id)
        hit, total = self._interval.pop(ep_id, (0.0, 0.0))
        sums = self._sums.get(ep_id)
        if sums is None:
            if total <= 0:
                return _NAN
            sums = self._sums[ep_id] = [0.0, 0.0]
        sums[0] = DECAY * sums[0] + hit
        sums[1] = DECAY * sums[1] + min(1.0, max(0.0, reported_rate)) * total
        return self.realization(ep_id)

    def realization(self, ep_id: int) -> float:
        sums = self._sums.get(ep_id)
        if sums is None or sums[0] <= 0:
            return _NAN  # nothing predicted to hit there: nothing to compare
        return min(1.0, sums[1] / sums[0])

    def forget(self, ep_id: int) -> None:
        self._interval.pop(ep_id, None)
        self._sums.pop(ep_id, None)
