"""The autoscaler's memory: past recommendations and corrected replica counts, and the window
queries the behaviour rules ask of them. Immutable: `record` returns a new History.

Kthena keeps five monotonic deques per target (pkg/autoscaler/datastructure): two "record"
windows over the metric recommendations (max for the scale-down stabilization window, min
for the scale-up one) and three "line chart" windows over the corrected counts (max over the
scale-down period, min over the scale-up and panic periods). We keep the samples themselves
and answer the same questions from them; the answers are the same as Kthena's deques give
(time is in seconds here, milliseconds there; freshness is inclusive, `t + window >= now`).

Record window (stabilization): the best recommendation among those made within `window`
seconds; none when the window is 0 or empty.

Line chart (rate limits): the corrected counts are a step function, each value holding from
the round it was chosen until the next one. The best value over the last `period` seconds
is the best of: the current replicas; the latest corrected value (if chosen within 2 x
period, Kthena's drift horizon); every earlier value that was still in force less than
`period` ago (it was replaced at t_k >= now - period) -- unless the round that replaced it
came more than 2 x period after it (Kthena then dropped the drifting value).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["History", "Sample", "line_chart_best", "record_window_best"]


@dataclass(frozen=True)
class Sample:
    time: float  # seconds (any monotonic origin)
    recommended: int  # the metric-derived recommendation of that round
    corrected: int  # the count after the behaviour rules (what was asked for)


@dataclass(frozen=True)
class History:
    samples: tuple[Sample, ...] = ()

    def record(self, sample: Sample, horizon: float) -> History:
        """Append a round and forget what no window of length <= horizon can see again.
        One sample older than the horizon is kept: the line chart needs its predecessor."""
        kept = self.samples + (sample,)
        cut = sample.time - 2 * horizon
        first = 0
        while first + 1 < len(kept) and kept[first + 1].time < cut:
            first += 1
        return History(kept[first:])


Better = Callable[[int, int], bool]
MAX: Better = operator.gt
MIN: Better = operator.lt


def record_window_best(history: History, now: float, window: float, better: Better) -> int | None:
    """Kthena's RmqRecordSlidingWindow.GetBest over the recommendations."""
    if window <= 0:
        return None
    best: int | None = None
    for s in history.samples:
        if s.time + window >= now and (best is None or better(s.recommended, best)):
            best = s.recommended
    return best


def line_chart_best(history: History, now: float, period: float, current: int, better: Better) -> int | None:
    """Kthena's RmqLineChartSlidingWindow.GetBest(current) over the corrected counts."""
    if period <= 0:
        return None
    value = current
    samples = history.samples
    if samples and samples[-1].time + 2 * period >= now and better(samples[-1].corrected, value):
        value = samples[-1].corrected
    for prev, nxt in zip(samples, samples[1:]):
        replaced_recently = nxt.time + period >= now
        drift_alive = prev.time + 2 * period >= nxt.time
        if replaced_recently and drift_alive and better(prev.corrected, value):
            value = prev.corrected
    return value
