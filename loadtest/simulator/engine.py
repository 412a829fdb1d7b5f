"""One simulated inference engine: a step loop over a continuous-batching scheduler.

All running sequences advance together, one step at a time; each step's duration comes
from the calibration table (cost_model.py), the KV cache is paged with prefix caching
(kvcache.py), scheduling follows vLLM V1 (scheduler.py). Times are simulated seconds
(clock.py); with time_scale k they run k times slower than wall time.

Step loop and lag: while busy, step k+1 is scheduled to start exactly when step k was
scheduled to end (not when the loop actually woke up), so short hiccups of a busy
machine are caught up and the simulated throughput matches the calibration; a step
never starts before the arrival of a request it admits. The loop sleeps until the
step's scheduled end, then delivers its tokens. `lag` is how late the loop woke
relative to that schedule (simulated seconds; 0 when on time); `lag_seconds` is the
value at the last step (0 when idle), `lag_max_seconds` the maximum since start. If
the lag ever exceeds MAX_CATCH_UP_S the schedule is reset to the current time rather
than sending a burst of overdue tokens (the lag stays visible in lag_max_seconds).
Token times and the TTFT/ITL/e2e histograms use the *scheduled* step ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .clock import Clock, RealClock
from .cost_model import CostModel
from .kvcache import KVCache, root_hash
from .scheduler import RUNNING, WAITING, HistogramAcc, Scheduler, SchedulerConfig, Sequence

MAX_CATCH_UP_S = 1.0


@dataclass
class EngineConfig:
    model: str = "demo"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # per-step token budget (chunked prefill)
    num_gpu_blocks: int | None = None  # None: from the memory settings below
    gpu_memory_gb: float = 141.0
    gpu_memory_utilization: float = 0.9
    weights_gb: float = 16.0
    kv_bytes_per_token: int = 131072
    max_model_len: int = 131072
    enable_prefix_caching: bool = True
    time_scale: float = 1.0
    seed: int = 0
    calibration_path: str | None = None  # default: calibration/h200-llama3-8b.json here
    max_loras: int | None = None  # distinct LoRA adapters per batch; None: no limit
    lora_load_s: float = 0.0  # loading an adapter into a GPU slot (simulated seconds)


def compute_num_gpu_blocks(cfg: EngineConfig) -> int:
    """KV blocks that fit in GPU memory after the weights (GB = 1e9 bytes, as the
    calibration README counts: 141 GB x 0.9 - 16 GB -> ~850k tokens -> ~53k blocks)."""
    kv_bytes = (cfg.gpu_memory_gb * cfg.gpu_memory_utilization - cfg.weights_gb) * 1e9
    blocks = int(kv_bytes // (cfg.kv_bytes_per_token * cfg.block_size))
    if blocks < 1:
        raise ValueError(
            f"no room for the KV cache: {cfg.gpu_memory_gb} GB x {cfg.gpu_memory_utilization} "
            f"leaves nothing after {cfg.weights_gb} GB of weights"
        )
    return blocks


@dataclass
class GenRequest:
    request_id: str
    prompt_tokens: list[int]
    max_tokens: int
    lora: str | None = None
    hold_kv: bool = False  # PD prefill: keep the KV after finishing until release_kv()
    kv_ready_tokens: int = 0  # PD decode: prompt tokens whose KV was read from a prefill


class SeqHandle:
    """One request's view: async-iterate it for the generated token ids.

    Output ids are a deterministic function of (request_id, EngineConfig.seed), in
    [1000, 30000). The engine generates max_tokens, capped so that prompt + output fit
    min(max_model_len, KV capacity) (finish_reason "length"). Ending the iteration
    early aborts the request (finish_reason "abort").
    """

    __slots__ = ("_seq", "_pos", "_engine")

    def __init__(self, seq: Sequence, engine: Engine) -> None:
        self._seq = seq
        self._pos = seq.prompt_len
        self._engine = engine

    @property
    def request_id(self) -> str:
        return self._seq.request_id

    @property
    def prompt_len(self) -> int:
        return self._seq.prompt_len

    @property
    def cached_tokens(self) -> int:
        """Prefix-cache hit tokens; 0 until first scheduled."""
        return self._seq.cached_tokens

    @property
    def finish_reason(self) -> str | None:
        return self._seq.finish_reason

    @property
    def num_generated(self) -> int:
        return self._seq.num_generated

    @property
    def arrival_time(self) -> float:
        """Simulated time of submit()."""
        return self._seq.arrival

    @property
    def token_times(self) -> list[float]:
        """Simulated time at which each generated token's step ended."""
        return self._seq.token_times

    @property
    def num_preemptions(self) -> int:
        return self._seq.num_preemptions

    def abort(self) -> None:
        """Abort this request only (even if another one has the same id)."""
        self._engine._abort_seq(self._seq)

    @property
    def block_ids(self) -> list[int]:
        """KV blocks the sequence holds (after a hold_kv finish: the ones kept)."""
        return list(self._seq.blocks)

    def release_kv(self) -> None:
        """Free the blocks of a finished hold_kv request."""
        self._engine.scheduler.release_held(self._seq)

    def __aiter__(self) -> AsyncIterator[int]:
        return self._tokens()

    async def _tokens(self) -> AsyncIterator[int]:
        # Closing the iterator before the end (break, aclose(), garbage collection: the
        # consumer went away) aborts the request, so that it stops holding KV blocks.
        seq = self._seq
        toks = seq.tokens
        try:
            while True:
                pos = self._pos
                if pos < len(toks):
                    self._pos = pos + 1
                    yield toks[pos]
                elif seq.finish_reason is not None:
                    return
                else:
                    fut = asyncio.get_running_loop().create_future()
                    seq.waiter = fut
                    await fut
        finally:
            if seq.finish_reason is None:
                self._engine._abort_seq(seq)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int]  # cumulative per bucket, like Prometheus (+Inf is `count`)
    sum: float
    count: int

    @classmethod
    def of(cls, acc: HistogramAcc) -> Histogram:
        return cls(acc.buckets, acc.cumulative(), acc.sum, acc.count)


@dataclass
class EngineSnapshot:
    running: int
    waiting: int
    kv_usage: float  # blocks in use by sequences / total, 0..1
    num_gpu_blocks: int
    cached_free_blocks: int
    prefix_queries_total: int  # tokens, like vllm:prefix_cache_queries
    prefix_hits_total: int  # tokens, like vllm:prefix_cache_hits
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    requests_finished_total: int  # including aborted
    ttft: Histogram  # simulated seconds, vLLM's buckets
    itl: Histogram
    e2e: Histogram
    running_loras: list[str]
    waiting_loras: list[str]
    lag_seconds: float  # simulated seconds behind schedule at the last step
    lag_max_seconds: float
    steps_total: int
    busy_fraction: float  # simulated time spent in steps / simulated time since start()
    block_size: int = 16
    cached_blocks: int = 0  # blocks findable by hash (in use or free)
    evictions_total: int = 0
    lora_loads_total: int = 0  # adapters loaded into a GPU slot


class Engine:
    def __init__(self, config: EngineConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock if clock is not None else RealClock(config.time_scale)
        self.cost = CostModel.load(config.calibration_path)
        n_blocks = config.num_gpu_blocks or compute_num_gpu_blocks(config)
        self.kv = KVCache(n_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(
                block_size=config.block_size,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                enable_prefix_caching=config.enable_prefix_caching,
                max_loras=config.max_loras,
                lora_load_s=config.lora_load_s,
            ),
            self.kv,
            self.cost,
        )
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._started_at = 0.0
        self._busy = 0.0
        self._lag = 0.0
        self._lag_max = 0.0
        self._steps = 0

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        if self.scheduler.has_work():
            self._wake.set()
        self._started_at = self.clock.now()
        self._task = asyncio.create_task(self._run(), name=f"engine-{self.config.model}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.scheduler.abort_all(self.clock.now())

    # --- requests -------------------------------------------------------------------
    def submit(self, req: GenRequest) -> SeqHandle:
        """Queue a request. Raises ValueError for one that could never run."""
        cfg = self.config
        prompt_len = len(req.prompt_tokens)
        if prompt_len < 1:
            raise ValueError("the prompt is empty")
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        # like vLLM, a sequence may grow to max_model_len, which must fit in the KV cache
        max_len = min(cfg.max_model_len, self.kv.num_blocks * cfg.block_size)
        if prompt_len >= max_len:
            raise ValueError(
                f"the prompt has {prompt_len} tokens; this model's maximum context length "
                f"is {max_len} tokens"
            )
        max_out = min(req.max_tokens, max_len - prompt_len)
        seed = zlib.crc32(req.request_id.encode()) ^ (cfg.seed * 0x9E3779B97F4A7C15)
        seq = Sequence(req.request_id, req.prompt_tokens, max_out, req.lora,
                       root_hash(req.lora), seed, self.clock.now())
        seq.hold_kv = req.hold_kv
        seq.remote_tokens = min(req.kv_ready_tokens, prompt_len)
        self.scheduler.add(seq)
        if self._wake is not None:
            self._wake.set()
        return SeqHandle(seq, self)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id, self.clock.now())

    def _abort_seq(self, seq: Sequence) -> None:
        self.scheduler.abort_seq(seq, self.clock.now())

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks (/flush_cache); False while requests hold blocks."""
        return self.kv.reset_prefix_cache()

    # --- step loop ------------------------------------------------------------------
    async def _run(self) -> None:
        clock, sched, wake = self.clock, self.scheduler, self._wake
        assert wake is not None
        t_sched = clock.now()
        try:
            while True:
                plan = sched.schedule()
                if plan is None:
                    self._lag = 0.0
                    wake.clear()
                    if not sched.has_work():
                        await wake.wait()
                    else:  # work that cannot be scheduled now (should not happen)
                        await asyncio.sleep(0.001)
                    t_sched = clock.now()
                    continue
                t_start = t_sched if t_sched >= plan.not_before else plan.not_before
                t_end = t_start + plan.duration
                lag = await clock.sleep_until(t_end)
                sched.commit(plan, t_end)
                self._steps += 1
                self._busy += plan.duration
                self._lag = lag
                if lag > self._lag_max:
                    self._lag_max = lag
                t_sched = t_end if lag <= MAX_CATCH_UP_S else clock.now()
                await asyncio.sleep(0)  # let consumers and submitters run between steps
        except asyncio.CancelledError:
            raise
        except BaseException:
            # never leave consumers hanging on a dead loop
            sched.abort_all(clock.now())
            raise

    # --- observation ----------------------------------------------------------------
    def snapshot(self) -> EngineSnapshot:
        sched, kv, st = self.scheduler, self.kv, self.scheduler.stats
        elapsed = self.clock.now() - self._started_at
        return EngineSnapshot(
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_usage=kv.usage(),
            num_gpu_blocks=kv.num_blocks,
            cached_free_blocks=kv.num_cached_free,
            prefix_queries_total=st.prefix_queries_total,
            prefix_hits_total=st.prefix_hits_total,
            prompt_tokens_total=st.prompt_tokens_total,
            generation_tokens_total=st.generation_tokens_total,
            preemptions_total=st.preemptions_total,
            requests_finished_total=st.requests_finished_total,
            ttft=Histogram.of(st.ttft),
            itl=Histogram.of(st.itl),
            e2e=Histogram.of(st.e2e),
            running_loras=sorted({s.lora for s in sched.running if s.lora is not None}),
            waiting_loras=sorted({s.lora for s in sched.waiting if s.lora is not None}),
            lag_seconds=self._lag,
            lag_max_seconds=self._lag_max,
            steps_total=self._steps,
            busy_fraction=min(1.0, self._busy / elapsed) if elapsed > 0 else 0.0,
            block_size=kv.block_size,
            cached_blocks=kv.num_cached_blocks,
            evictions_total=kv.evictions_total,
            lora_loads_total=st.lora_loads_total,
        )


__all__ = [
    "Engine", "EngineConfig", "EngineSnapshot", "GenRequest", "Histogram", "SeqHandle",
    "compute_num_gpu_blocks", "RUNNING", "WAITING",
]
