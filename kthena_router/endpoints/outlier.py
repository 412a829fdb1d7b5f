"""Pure bookkeeping behind outlier detection (no clock of its own: callers pass `now`).

- FailureWindow: attempt outcomes over a sliding interval, in a fixed ring of time
  buckets, so recording and reading cost O(buckets) at most and memory is constant
  whatever the request rate.
- StallTracker: the attempts of one endpoint still waiting for their first byte, in start
  order, and the endpoint's recent time to first byte (EWMA). An attempt waiting longer
  than max(stallMinimum, stallFactor x recent TTFT) is judged stalled once; the endpoint
  makes no progress while a stalled attempt started after its last first byte (older
  stalled attempts alone do not count: a later answer shows the engine is working).
  Judging happens when someone asks (candidate selection), so there is no timer per
  request.
"""

from __future__ import annotations

import math
from collections import OrderedDict

BUCKETS = 10
TTFT_ALPHA = 0.2  # EWMA weight of the newest first-byte time

# Pending.state
WAITING, STALLED, ANSWERED, ANSWERED_COUNTED, DONE = range(5)


class FailureWindow:
    """Outcome counts over the last `interval_s` (to one bucket's width)."""

    __slots__ = ("_width", "_epochs", "_total", "_failed")

    def __init__(self, interval_s: float) -> None:
        self._width = interval_s / BUCKETS
        self._epochs = [-1] * BUCKETS
        self._total = [0] * BUCKETS
        self._failed = [0] * BUCKETS

    def record(self, now: float, failed: bool) -> None:
        epoch = int(now // self._width)
        i = epoch % BUCKETS
        if self._epochs[i] != epoch:
            self._epochs[i] = epoch
            self._total[i] = 0
            self._failed[i] = 0
        self._total[i] += 1
        if failed:
            self._failed[i] += 1

    def counts(self, now: float) -> tuple[int, int]:
        """(outcomes, failures) in the interval ending at `now`."""
        oldest = int(now // self._width) - BUCKETS + 1
        total = failed = 0
        for i in range(BUCKETS):
            if self._epochs[i] >= oldest:
                total += self._total[i]
                failed += self._failed[i]
        return total, failed

    def clear(self) -> None:
        self._epochs = [-1] * BUCKETS


class Pending:
    """One attempt on an endpoint, from sending it until its outcome (no back reference,
    so nothing here forms a reference cycle)."""

    __slots__ = ("start", "state")

    def __init__(self, start: float) -> None:
        self.start = start
        self.state = WAITING


class StallTracker:
    __slots__ = ("waiting", "stalled", "last_progress", "ttft")

    def __init__(self) -> None:
        self.waiting: OrderedDict[Pending, None] = OrderedDict()  # start order
        self.stalled: OrderedDict[Pending, None] = OrderedDict()  # judged, still in flight
        self.last_progress = -math.inf  # time of the endpoint's last first byte
        self.ttft: float | None = None

    def begin(self, now: float) -> Pending:
        p = Pending(now)
        self.waiting[p] = None
        return p

    def first_byte(self, p: Pending, now: float) -> None:
        if p.state == WAITING:
            del self.waiting[p]
            p.state = ANSWERED
        elif p.state == STALLED:
            del self.stalled[p]
            p.state = ANSWERED_COUNTED
        else:
            return
        self.last_progress = now
        x = now - p.start
        self.ttft = x if self.ttft is None else self.ttft + TTFT_ALPHA * (x - self.ttft)

    def end(self, p: Pending) -> bool | None:
        """The attempt is over. None if it already was; True if it was already counted
        (judged stalled), False if its outcome is still to be recorded."""
        state = p.state
        if state == DONE:
            return None
        p.state = DONE
        if state == WAITING:
            del self.waiting[p]
        elif state == STALLED:
            del self.stalled[p]
        return state in (STALLED, ANSWERED_COUNTED)

    def threshold(self, factor: float, minimum: float) -> float:
        return minimum if self.ttft is None else max(minimum, factor * self.ttft)

    def judge(self, now: float, factor: float, minimum: float) -> int:
        """Mark the attempts waiting longer than the threshold as stalled; returns how many
        were newly judged (each counts as one failure, once)."""
        waiting = self.waiting
        if not waiting:
            return 0
        limit = now - self.threshold(factor, minimum)
        n = 0
        while waiting:
            p = next(iter(waiting))
            if p.start >= limit:
                break
            del waiting[p]
            p.state = STALLED
            self.stalled[p] = None
            n += 1
        return n

    def progressing(self) -> bool:
        """False while a stalled attempt started after the endpoint's last first byte."""
        if not self.stalled:
            return True
        return next(reversed(self.stalled)).start < self.last_progress
