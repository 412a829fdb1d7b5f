"""Duration of one engine step, interpolated from a calibration table.

The table (calibration/h200-llama3-8b.json, see /work/shared/calibration/README.md) has
three parts; each is used by piecewise-linear interpolation, never by a fitted formula:

cold prefill  C(N): ms for N new tokens with no cached context (the batch-1 rows). The
    batched rows (4x1024, 8x512, 16x256: 94-95 ms vs 102 ms for 1x4096) show that a
    compute-bound prefill costs by its *total* new tokens, so all prefill chunks of a
    step are summed into one N. Below the first point (128 tokens) we interpolate
    towards (1 token, W): a one-token forward pass is a batch-1 decode step.
    Beyond the last point (16384) the last segment's slope continues (linear in tokens).

cached-context surcharge S(n*c): a chunk of n new tokens on top of c tokens already
    in the KV cache (prefix hit, or an earlier chunk of the same prompt) also attends to
    those c tokens. S is interpolated over the number of query-key pairs n*c, from the
    `prefix_prefill` rows: S_i = max(0, ms_i - C(n_i)), made non-decreasing (the
    smallest rows are dominated by launch overhead and measure slightly *below* C(n)).
    Beyond the last point S grows along the line through the origin and that point
    (attention work is proportional to n*c). Example: 64 new on 4032 cached costs
    C(64) + S(258k) = ~9.6 ms, against 102 ms for a cold 4096-token prefill.

decode D(B, L): ms for one decode step of B sequences with mean context L. Each
    context row (512, 2048, 4096, 8192) is interpolated linearly in B; past a row's
    last batch point its last slope continues (B x L KV reads grow linearly). Between
    rows: linear in L. Below 512: the 512 row (KV reads negligible there). Above 8192:
    linear continuation of the 4096->8192 difference (KV reads grow linearly in L).
    Using the mean context is exact for a memory-bound step, whose KV traffic is the
    sum of the contexts = B x mean.

W = D(1, 512) (~5.7 ms) is the floor every forward pass pays: reading the weights once
plus launch overhead.

Mixed step (decodes plus prefill chunks in one forward pass, as vLLM's chunked prefill
does): D + P - W, where P = C(N) + sum of S(n_i * c_i). Decode is memory bound (weights
+ KV reads) and prefill compute bound; in one fused pass the prefill's matmuls do not
hide the decodes' KV reads, so the two add, but the weights are read once, so W is
counted once. The result is never below max(D, P).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CALIBRATION = Path(__file__).parent / "calibration" / "h200-llama3-8b.json"


@dataclass(frozen=True)
class PiecewiseLinear:
    """y(x) through sorted points; constant below xs[0]; beyond xs[-1] slope `tail_slope`."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    tail_slope: float

    @classmethod
    def through(cls, points: list[tuple[float, float]], tail: str = "last_segment") -> PiecewiseLinear:
        pts = sorted(points)
        xs = tuple(float(p[0]) for p in pts)
        ys = tuple(float(p[1]) for p in pts)
        if len(xs) < 1:
            raise ValueError("need at least one point")
        if tail == "origin":
            slope = ys[-1] / xs[-1] if xs[-1] > 0 else 0.0
        elif len(xs) >= 2:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        else:
            slope = 0.0
        return cls(xs, ys, slope)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] + (x - xs[-1]) * self.tail_slope
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class CostModel:
    """Step durations in seconds (simulated time) from a calibration table."""

    def __init__(self, table: dict) -> None:
        decode_rows: dict[int, list[tuple[float, float]]] = {}
        for r in table["decode"]:
            decode_rows.setdefault(int(r["context"]), []).append((r["batch"], r["ms_per_step"]))
        self._ctx = tuple(sorted(decode_rows))
        self._rows = tuple(PiecewiseLinear.through(decode_rows[c]) for c in self._ctx)
        self.floor_ms = self.decode_ms(1, self._ctx[0])

        cold = [(r["new_tokens"], r["ms"]) for r in table["prefill"] if r["batch"] == 1]
        cold.append((1, self.floor_ms))
        self._cold = PiecewiseLinear.through(cold)

        raw = sorted(
            (r["new_tokens"] * r["cached_tokens"], max(0.0, r["ms"] - self._cold(r["new_tokens"])))
            for r in table["prefix_prefill"]
        )
        mono: list[tuple[float, float]] = [(0.0, 0.0)]
        for pairs, ms in raw:
            mono.append((pairs, max(ms, mono[-1][1])))
        self._surcharge = PiecewiseLinear.through(mono, tail="origin")

    @classmethod
    def load(cls, path: str | Path | None = None) -> CostModel:
        with open(path or DEFAULT_CALIBRATION, encoding="utf-8") as f:
            return cls(json.load(f))

    # --- table lookups (milliseconds) ---------------------------------------------
    def decode_ms(self, batch: int, context: float) -> float:
        ctx, rows = self._ctx, self._rows
        if context <= ctx[0]:
            return rows[0](batch)
        if context >= ctx[-1]:
            hi, lo = rows[-1](batch), rows[-2](batch)
            return hi + (hi - lo) * (context - ctx[-1]) / (ctx[-1] - ctx[-2])
        i = bisect.bisect_right(ctx, context)
        c0, c1 = ctx[i - 1], ctx[i]
        y0, y1 = rows[i - 1](batch), rows[i](batch)
        return y0 + (y1 - y0) * (context - c0) / (c1 - c0)

    def cold_prefill_ms(self, new_tokens: int) -> float:
        return self._cold(new_tokens)

    def surcharge_ms(self, new_tokens: int, cached_tokens: int) -> float:
        if cached_tokens <= 0:
            return 0.0
        return self._surcharge(new_tokens * cached_tokens)

    def prefill_ms(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """One prefill chunk alone."""
        return self._cold(new_tokens) + self.surcharge_ms(new_tokens, cached_tokens)

    # --- one step -----------------------------------------------------------------
    def step_seconds(
        self,
        num_decodes: int,
        decode_context_sum: int,
        prefill_tokens: int,
        prefill_chunks: list[tuple[int, int]],
    ) -> float:
        """Duration of a step with `num_decodes` decodes (total context
        `decode_context_sum`) and prefill chunks [(new_tokens, cached_tokens), ...]
        summing to `prefill_tokens` new tokens."""
        d = self.decode_ms(num_decodes, decode_context_sum / num_decodes) if num_decodes else 0.0
        if prefill_tokens <= 0:
            return d / 1000.0
        p = self._cold(prefill_tokens)
        for n, c in prefill_chunks:
            if c > 0:
                p += self._surcharge(n * c)
        if num_decodes == 0:
            return p / 1000.0
        return max(d + p - self.floor_ms, d, p) / 1000.0
