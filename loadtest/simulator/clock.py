"""Clocks for the engine step loop. All engine times are *simulated* seconds.

RealClock: simulated time = wall time since creation / time_scale; with time_scale k
    simulated time runs k times slower than the calibration, so a busy machine has k
    times more wall time per step to keep up.
VirtualClock: time only moves when the step loop sleeps until a step's end; nothing
    really sleeps, so unit tests are fast and deterministic.

`sleep_until(t)` returns the lag: how late (simulated seconds) the caller woke up
relative to t, 0 when on time. The engine reports it (see engine.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

# asyncio timers (uvloop: 1 ms resolution) may fire slightly early; closer than this
# to the deadline (wall seconds) we do not sleep again.
_EARLY_TOLERANCE_S = 0.0005


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> float: ...


class RealClock:
    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.time_scale

    async def sleep_until(self, t: float) -> float:
        deadline = self._t0 + t * self.time_scale
        while True:
            delay = deadline - time.monotonic()
            if delay <= _EARLY_TOLERANCE_S:
                break
            await asyncio.sleep(delay)
        late = time.monotonic() - deadline
        return late / self.time_scale if late > 0 else 0.0


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> None:
        """Let simulated time pass while idle (tests)."""
        self._t += dt

    async def sleep_until(self, t: float) -> float:
        if t > self._t:
            self._t = t
        await asyncio.sleep(0)
        return 0.0
