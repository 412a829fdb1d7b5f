"""The autoscaler benchmark's workload: a day-shaped arrival rate, compressed.

Three clocks (docs/autoscaler-benchmark.md):
- trace time: the day being replayed, 0..86400 s; the autoscaler's periods, windows and the
  replicas' startup delay are stated in it;
- simulated time: the engines' physics (the simulator's clock, wall / time_scale); TTFT and
  the 2 s SLO are in it;
- a trace day lasts `day_s` simulated seconds: trace = simulated x (86400 / day_s).

The rate is `peak_rate` (requests per simulated second) times a shape in 0..1 over the
trace hours: night trough, morning ramp, midday plateau, a short burst (the peak),
evening decline. Arrivals are a non-homogeneous Poisson process (thinning), prompt and
output lengths log-normal (a chat workload's skew, clipped); texts are words the
simulator's tokenizer encodes as one token each, so token counts are exact. Everything is
a function of the seed.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from loadtest.pd_bench.workload import Request, template_tokens
from loadtest.shared_prefix.workload import words_text

DAY_S = 86400.0
# (trace hour, fraction of the peak rate), linear in between
SHAPE: tuple[tuple[float, float], ...] = (
    (0.0, 0.15), (4.0, 0.10), (6.0, 0.12), (9.0, 0.50), (11.0, 0.55), (16.0, 0.55),
    (19.0, 0.35), (22.0, 0.20), (24.0, 0.15),
)
# the burst: (start hour, end hour, fraction added on top of the shape); the peak is 1.0
BURST = (13.0, 13.75, 0.45)


@dataclass(frozen=True)
class TraceSpec:
    day_s: float  # simulated seconds per trace day
    peak_rate: float  # requests per simulated second at the shape's maximum
    seed: int
    prompt_median: int = 512  # tokens, chat template included
    prompt_sigma: float = 0.6
    prompt_min: int = 64
    prompt_max: int = 3072
    output_median: int = 96
    output_sigma: float = 0.5
    output_min: int = 16
    output_max: int = 384

    @property
    def compression(self) -> float:
        """Trace seconds per simulated second."""
        return DAY_S / self.day_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "compression": self.compression,
                "shape": [list(p) for p in SHAPE], "burst": list(BURST)}


def shape(hour: float) -> float:
    """The rate as a fraction of the peak at a trace hour (0..24)."""
    hour = min(max(hour, 0.0), 24.0)
    hours = [h for h, _ in SHAPE]
    i = max(1, bisect.bisect_right(hours, hour))
    i = min(i, len(SHAPE) - 1)
    (h0, v0), (h1, v1) = SHAPE[i - 1], SHAPE[i]
    v = v0 + (v1 - v0) * (hour - h0) / (h1 - h0)
    if BURST[0] <= hour < BURST[1]:
        v += BURST[2]
    return v


def _lognormal(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))))


def arrivals(spec: TraceSpec) -> list[float]:
    """Arrival times in simulated seconds (thinning against the peak rate)."""
    rng = random.Random(spec.seed * 1_000_003 + 17)
    hour_s = spec.day_s / 24.0
    top = spec.peak_rate * max(max(v for _, v in SHAPE) + BURST[2], 1.0)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(top)
        if t >= spec.day_s:
            return out
        if rng.random() * top < spec.peak_rate * shape(t / hour_s):
            out.append(t)


def generate(spec: TraceSpec) -> list[Request]:
    """The requests of the trace, in send order (offset_s in simulated seconds)."""
    rng = random.Random(spec.seed * 7919 + 3)
    tmpl = template_tokens()
    out = []
    for i, t in enumerate(arrivals(spec)):
        prompt = _lognormal(rng, spec.prompt_median, spec.prompt_sigma, spec.prompt_min, spec.prompt_max)
        content = max(2, prompt - tmpl)
        output = _lognormal(rng, spec.output_median, spec.output_sigma, spec.output_min, spec.output_max)
        out.append(Request(i, t, tuple(words_text(rng, content).split(" ")), output, None, content))
    return out


def hour_of(spec: TraceSpec, sim_s: float) -> int:
    """The trace hour (0..23) a simulated instant falls in."""
    return min(23, max(0, int(sim_s / (spec.day_s / 24.0))))
