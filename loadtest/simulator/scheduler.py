"""Continuous-batching scheduler (vLLM V1-like) over the paged KV cache.

Token accounting as in vLLM V1: a sequence has `tokens` (prompt + generated so far) and
`num_computed` (tokens whose KV is in the cache). Each step a sequence is given
`n = len(tokens) - num_computed` new tokens (capped by the step's token budget): a
whole or partial prompt (chunked prefill) or, once generating, the 1 token sampled last
step. When a step computes all of a sequence's tokens, it samples one more token.

Each step (schedule()):
1. running sequences in admission order get their tokens; a sequence that needs a new
   block when none is free preempts the most recently admitted running sequence (its
   blocks are freed, it goes back to the front of the waiting queue and recomputes
   prompt + generated tokens later, possibly from the prefix cache), possibly itself;
2. if nothing was preempted, waiting sequences are admitted in order while the token
   budget, max_num_seqs, the LoRA limit and free blocks allow; the prefix cache is
   looked up at admission (full blocks only, at most len(tokens) - 1 tokens, so that
   at least one token is computed); a sequence with a LoRA that would exceed max_loras
   is skipped and keeps its place. The GPU holds max_loras adapter slots (LRU): admitting
   a sequence whose adapter is not in a slot loads it (evicting the least recently used
   one not in the batch) and adds `lora_load_s` to that step, as vLLM's LRU GPU cache does.
Full blocks get their hashes registered when scheduled (as vLLM does), so later
admissions, even in the same step, can hit them.

Prefix-cache counters are in tokens, like vllm:prefix_cache_queries/hits, and count a
request's first admission only (re-admissions after preemption are not counted).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .cost_model import CostModel
from .kvcache import KVCache, hash_block

WAITING, RUNNING, FINISHED = 0, 1, 2
_MASK64 = (1 << 64) - 1
_TOKEN_LOW, _TOKEN_SPAN = 1000, 29000  # output ids in [1000, 30000)

# vLLM's bucket boundaries (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class HistogramAcc:
    """Per-bucket (non-cumulative) counts; the last slot is +Inf."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += n
        self.sum += v * n
        self.count += n

    def cumulative(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts[:-1]:
            acc += c
            out.append(acc)
        return out


class Sequence:
    __slots__ = (
        "request_id", "prompt_len", "tokens", "max_output", "lora", "root", "num_computed",
        "blocks", "block_hashes", "num_cached_blocks", "cached_tokens", "status",
        "finish_reason", "arrival", "first_token_time", "last_token_time", "token_times",
        "rng", "waiter", "admitted", "num_preemptions", "hold_kv", "remote_tokens",
    )

    def __init__(self, request_id: str, prompt: list[int], max_output: int, lora: str | None,
                 root: int, rng_seed: int, arrival: float) -> None:
        self.request_id = request_id
        self.prompt_len = len(prompt)
        self.tokens = list(prompt)
        self.max_output = max_output
        self.lora = lora
        self.root = root
        self.num_computed = 0
        self.blocks: list[int] = []
        self.block_hashes: list[int] = []  # hashes of full blocks of `tokens`, computed once
        self.num_cached_blocks = 0  # leading blocks of `blocks` registered in the cache
        self.cached_tokens = 0
        self.status = WAITING
        self.finish_reason: str | None = None
        self.arrival = arrival
        self.first_token_time: float | None = None
        self.last_token_time = 0.0
        self.token_times: list[float] = []
        self.rng = rng_seed & _MASK64
        self.waiter = None  # asyncio.Future of a consumer waiting for tokens
        self.admitted = False
        self.num_preemptions = 0
        # PD: keep the blocks after a "length" finish until release_held() (a prefill
        # whose KV a decode engine will read); prompt tokens whose KV came from another
        # engine (a decode after a remote prefill): not computed here, only allocated
        self.hold_kv = False
        self.remote_tokens = 0

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def notify(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)


@dataclass
class SchedulerConfig:
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    max_loras: int | None = None
    lora_load_s: float = 0.0  # simulated seconds to load an adapter into a GPU slot


@dataclass
class StepPlan:
    seqs: list[Sequence]
    nums: list[int]  # new tokens computed for each sequence this step
    duration: float  # simulated seconds
    not_before: float  # latest arrival among sequences admitted this step
    num_decodes: int = 0
    prefill_tokens: int = 0


@dataclass
class SchedulerStats:
    prefix_queries_total: int = 0
    prefix_hits_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    preemptions_total: int = 0
    requests_finished_total: int = 0
    lora_loads_total: int = 0  # adapters loaded into a GPU slot
    ttft: HistogramAcc = field(default_factory=lambda: HistogramAcc(TTFT_BUCKETS))
    itl: HistogramAcc = field(default_factory=lambda: HistogramAcc(ITL_BUCKETS))
    e2e: HistogramAcc = field(default_factory=lambda: HistogramAcc(E2E_BUCKETS))


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCache, cost: CostModel) -> None:
        self.cfg = cfg
        self.kv = kv
        self.cost = cost
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.by_id: dict[str, list[Sequence]] = {}
        self.stats = SchedulerStats()
        self.lora_slots: OrderedDict[str, None] = OrderedDict()  # LRU, at most max_loras

    # --- requests -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.by_id.setdefault(seq.request_id, []).append(seq)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def abort(self, request_id: str, t: float) -> None:
        for seq in self.by_id.pop(request_id, ()):
            self._abort_seq(seq, t)

    def abort_seq(self, seq: Sequence, t: float) -> None:
        if seq.status == FINISHED:
            return
        same = self.by_id.get(seq.request_id)
        if same is not None:
            same.remove(seq)
            if not same:
                del self.by_id[seq.request_id]
        self._abort_seq(seq, t)

    def release_held(self, seq: Sequence) -> None:
        """Free the blocks a finished hold_kv sequence kept (read by a decode, or expired)."""
        if seq.status == FINISHED and seq.blocks:
            self.kv.free(seq.blocks)
            seq.blocks = []

    def abort_all(self, t: float) -> None:
        for rid in list(self.by_id):
            self.abort(rid, t)

    def _abort_seq(self, seq: Sequence, t: float) -> None:
        if seq.status == WAITING:
            self.waiting.remove(seq)
        elif seq.status == RUNNING:
            self.running.remove(seq)
        else:
            return
        self._finish(seq, "abort", t)

    def _finish(self, seq: Sequence, reason: str, t: float) -> None:
        seq.status = FINISHED
        seq.finish_reason = reason
        if seq.blocks and not (seq.hold_kv and reason == "length"):
            self.kv.free(seq.blocks)
            seq.blocks = []
        st = self.stats
        st.requests_finished_total += 1
        if reason != "abort":
            st.e2e.observe(t - seq.arrival)
        seq.notify()

    # --- block bookkeeping ----------------------------------------------------------
    def _hashes_upto(self, seq: Sequence, k: int) -> list[int]:
        bh = seq.block_hashes
        if len(bh) < k:
            bs, toks = self.cfg.block_size, seq.tokens
            parent = bh[-1] if bh else seq.root
            for i in range(len(bh), k):
                parent = hash_block(parent, tuple(toks[i * bs:(i + 1) * bs]))
                bh.append(parent)
        return bh

    def _register_full_blocks(self, seq: Sequence, upto_tokens: int) -> None:
        full = upto_tokens // self.cfg.block_size
        c = seq.num_cached_blocks
        if full <= c:
            return
        bh = self._hashes_upto(seq, full)
        bs = self.cfg.block_size
        self.kv.cache_blocks(seq.blocks[c:full], bh[c:full], bh[c - 1] if c else None,
                             seq.tokens[c * bs:full * bs], seq.lora)
        seq.num_cached_blocks = full

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_cached_blocks = 0
        seq.status = WAITING
        seq.num_preemptions += 1
        self.stats.preemptions_total += 1
        self.waiting.appendleft(seq)

    # --- one step -------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        cfg, kv = self.cfg, self.kv
        bs = cfg.block_size
        caching = cfg.enable_prefix_caching
        budget = cfg.max_num_batched_tokens
        seqs: list[Sequence] = []
        nums: list[int] = []
        n_dec = ctx_sum = pf_tokens = 0
        load_s = 0.0
        chunks: list[tuple[int, int]] = []
        not_before = 0.0
        preempted = False

        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed
            n = len(seq.tokens) - computed
            if n > budget:
                n = budget
            need = (computed + n + bs - 1) // bs - len(seq.blocks)
            if need > 0:
                while need > kv.num_free:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status != RUNNING:
                    break
                seq.blocks.extend(kv.allocate(need))
            if caching and (computed + n) // bs > seq.num_cached_blocks:
                self._register_full_blocks(seq, computed + n)
            seqs.append(seq)
            nums.append(n)
            budget -= n
            if n == 1 and computed >= seq.prompt_len:
                n_dec += 1
                ctx_sum += computed + 1
            else:
                pf_tokens += n
                chunks.append((n, computed))
            i += 1

        if not preempted and self.waiting:
            waiting = self.waiting
            skipped: list[Sequence] = []
            loras: set[str] | None = None
            if cfg.max_loras is not None:
                loras = {s.lora for s in running if s.lora is not None}
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                seq = waiting[0]
                if loras is not None and seq.lora is not None and seq.lora not in loras:
                    if len(loras) >= cfg.max_loras:  # type: ignore[operator]
                        skipped.append(waiting.popleft())
                        continue
                num_tokens = len(seq.tokens)
                hits: list[int] = []
                if caching:
                    hits = kv.lookup(self._hashes_upto(seq, (num_tokens - 1) // bs))
                hit_tokens = len(hits) * bs
                # KV read from a prefill engine counts as computed (no compute cost here);
                # the last prompt token is recomputed to sample, as vLLM does after a load
                start = hit_tokens
                if seq.remote_tokens > hit_tokens:
                    start = min(seq.remote_tokens, num_tokens - 1)
                n = min(num_tokens - start, budget)
                need = (start + n + bs - 1) // bs - len(hits)
                if need + kv.num_free_among(hits) > kv.num_free:
                    break
                waiting.popleft()
                kv.touch(hits)
                seq.blocks = hits + kv.allocate(need)
                seq.num_cached_blocks = len(hits)
                seq.num_computed = start
                seq.remote_tokens = 0  # a re-admission after preemption recomputes
                seq.status = RUNNING
                if not seq.admitted:
                    seq.admitted = True
                    seq.cached_tokens = hit_tokens
                    if caching:
                        self.stats.prefix_queries_total += num_tokens
                        self.stats.prefix_hits_total += hit_tokens
                if caching and (start + n) // bs > seq.num_cached_blocks:
                    self._register_full_blocks(seq, start + n)
                running.append(seq)
                if loras is not None and seq.lora is not None:
                    loras.add(seq.lora)
                    load_s += self._use_slot(seq.lora, loras)
                if seq.arrival > not_before:
                    not_before = seq.arrival
                seqs.append(seq)
                nums.append(n)
                budget -= n
                pf_tokens += n
                chunks.append((n, start))
            if skipped:
                waiting.extendleft(reversed(skipped))

        if not seqs:
            return None
        duration = self.cost.step_seconds(n_dec, ctx_sum, pf_tokens, chunks) + load_s
        return StepPlan(seqs, nums, duration, not_before, n_dec, pf_tokens)

    def _use_slot(self, lora: str, batch: set[str]) -> float:
        """Mark `lora` used; load it into a slot if absent (-> its load time)."""
        slots = self.lora_slots
        if lora in slots:
            slots.move_to_end(lora)
            return 0.0
        slots[lora] = None
        limit = self.cfg.max_loras or len(slots)
        for victim in [v for v in slots if v not in batch][:max(0, len(slots) - limit)]:
            del slots[victim]
        self.stats.lora_loads_total += 1
        return self.cfg.lora_load_s

    def commit(self, plan: StepPlan, t_end: float) -> None:
        """Apply a step that ended at simulated time t_end: sample tokens, finish."""
        st = self.stats
        itl = st.itl
        any_finished = False
        last_gap = -1.0
        gap_count = 0
        for seq, n in zip(plan.seqs, plan.nums):
            if seq.status != RUNNING:
                continue  # aborted (or preempted) while the step ran
            computed = seq.num_computed + n
            seq.num_computed = computed
            toks = seq.tokens
            if computed != len(toks):
                continue  # prefill chunk not finished: nothing sampled
            x = (seq.rng * 6364136223846793005 + 1442695040888963407) & _MASK64
            seq.rng = x
            toks.append(_TOKEN_LOW + (x >> 33) % _TOKEN_SPAN)
            seq.token_times.append(t_end)
            if seq.first_token_time is None:
                seq.first_token_time = t_end
                st.ttft.observe(t_end - seq.arrival)
                st.prompt_tokens_total += seq.prompt_len
            else:
                gap = t_end - seq.last_token_time
                if gap == last_gap:
                    gap_count += 1
                else:
                    if gap_count:
                        itl.observe(last_gap, gap_count)
                    last_gap, gap_count = gap, 1
            seq.last_token_time = t_end
            st.generation_tokens_total += 1
            if len(toks) - seq.prompt_len >= seq.max_output:
                same = self.by_id.get(seq.request_id)
                if same is not None:
                    same.remove(seq)
                    if not same:
                        del self.by_id[seq.request_id]
                self._finish(seq, "length", t_end)
                any_finished = True
            else:
                seq.notify()
        if gap_count:
            itl.observe(last_gap, gap_count)
        if any_finished:
            self.running = [s for s in self.running if s.status == RUNNING]
