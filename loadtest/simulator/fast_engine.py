"""FastEngine: the Engine interface with fixed tiny latencies and no KV physics.

For router overhead benchmarks: a first token after `ttft_s`, then one token every
`itl_s`. uvloop timers have 1 ms resolution, so sub-millisecond delays are kept on
a cumulative schedule: the handle sleeps only once it is at least 1 ms ahead of the
schedule and otherwise just yields to the event loop (no busy waiting). Cheap in CPU:
no per-token allocation beyond the yielded int.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_MIN_SLEEP_S = 0.001


@dataclass
class GenRequest:
    request_id: str
    prompt_tokens: list[int]
    max_tokens: int
    lora: str | None = None
    hold_kv: bool = False  # PD fields, as engine.GenRequest (no KV here: bookkeeping only)
    kv_ready_tokens: int = 0


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int]  # cumulative per bucket
    sum: float
    count: int


@dataclass
class EngineSnapshot:
    running: int
    waiting: int
    kv_usage: float
    num_gpu_blocks: int
    cached_free_blocks: int
    prefix_queries_total: int
    prefix_hits_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    requests_finished_total: int
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    running_loras: list[str]
    waiting_loras: list[str]
    lag_seconds: float
    lag_max_seconds: float
    steps_total: int
    busy_fraction: float
    block_size: int = 16
    cached_blocks: int = 0
    evictions_total: int = 0


@dataclass
class _Acc:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (non-cumulative) + overflow
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def snapshot(self) -> Histogram:
        cum, acc = [], 0
        for c in self.counts[:-1]:
            acc += c
            cum.append(acc)
        return Histogram(self.buckets, cum, self.sum, self.count)


class FastHandle:
    __slots__ = ("request_id", "prompt_len", "cached_tokens", "finish_reason", "lora",
                 "_engine", "_max", "_aborted", "block_ids")

    def __init__(self, engine: FastEngine, req: GenRequest) -> None:
        self.request_id = req.request_id
        self.prompt_len = len(req.prompt_tokens)
        self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.lora = req.lora
        self._engine = engine
        self._max = req.max_tokens
        self._aborted = False
        bs = getattr(engine.config, "block_size", 16)
        self.block_ids = list(range(-(-self.prompt_len // bs)))  # no KV: ids for the PD wire

    def release_kv(self) -> None:
        pass

    def abort(self) -> None:
        if self.finish_reason is None:
            self._aborted = True
            self._engine._finish(self, "abort")

    def __aiter__(self) -> AsyncIterator[int]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[int]:
        eng = self._engine
        ids, n_ids = eng.output_ids, len(eng.output_ids)
        t0 = time.perf_counter()
        due = t0 + eng.ttft_s
        last = t0
        try:
            for i in range(self._max):
                now = time.perf_counter()
                if due - now >= _MIN_SLEEP_S:
                    await asyncio.sleep(due - now)
                    now = time.perf_counter()
                else:
                    await asyncio.sleep(0)
                if self._aborted:
                    return
                if i == 0:
                    eng._ttft.observe(now - t0)
                else:
                    eng._itl.observe(now - last)
                last = now
                due += eng.itl_s
                eng.generation_tokens_total += 1
                yield ids[i % n_ids]
            eng._e2e.observe(time.perf_counter() - t0)
            eng._finish(self, "length")
        finally:
            # the consumer stopped early (client went away): count it as aborted
            if self.finish_reason is None:
                eng._finish(self, "abort")


class FastEngine:
    """Same interface as engine.Engine (submit/abort/snapshot/start/stop)."""

    def __init__(self, config, clock=None, *, ttft_s: float = 0.0002, itl_s: float = 0.00005,
                 output_ids: list[int] | None = None) -> None:
        self.config = config
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.output_ids = output_ids or list(range(100, 164))
        self._active: dict[str, FastHandle] = {}
        self._ttft = _Acc(TTFT_BUCKETS)
        self._itl = _Acc(ITL_BUCKETS)
        self._e2e = _Acc(E2E_BUCKETS)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished_total = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        for h in list(self._active.values()):
            h.abort()

    def submit(self, req: GenRequest) -> FastHandle:
        if not req.prompt_tokens:
            raise ValueError("the prompt is empty")
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        h = FastHandle(self, req)
        self._active[req.request_id] = h
        self.prompt_tokens_total += h.prompt_len
        return h

    def abort(self, request_id: str) -> None:
        h = self._active.get(request_id)
        if h is not None:
            h.abort()

    def reset_prefix_cache(self) -> bool:
        return True

    def _finish(self, h: FastHandle, reason: str) -> None:
        if h.finish_reason is not None:
            return
        h.finish_reason = reason
        if self._active.get(h.request_id) is h:
            del self._active[h.request_id]
        self.requests_finished_total += 1

    def snapshot(self) -> EngineSnapshot:
        running = list(self._active.values())
        return EngineSnapshot(
            running=len(running), waiting=0, kv_usage=0.0, num_gpu_blocks=0,
            cached_free_blocks=0, prefix_queries_total=0, prefix_hits_total=0,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total, preemptions_total=0,
            requests_finished_total=self.requests_finished_total,
            ttft=self._ttft.snapshot(), itl=self._itl.snapshot(), e2e=self._e2e.snapshot(),
            running_loras=sorted({h.lora for h in running if h.lora}), waiting_loras=[],
            lag_seconds=0.0, lag_max_seconds=0.0, steps_total=0, busy_fraction=0.0,
            block_size=getattr(self.config, "block_size", 16),
        )
