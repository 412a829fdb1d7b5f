"""It is an engine: batching, chunked prefill, preemption, capacity, abort, real time."""

import asyncio
import statistics
import time

import pytest

from loadtest.simulator.clock import VirtualClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest, compute_num_gpu_blocks


async def drain(h) -> list[int]:
    return [t async for t in h]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


@pytest.fixture
async def engine_factory():
    engines: list[Engine] = []

    async def make(clock=None, **kw) -> Engine:
        e = Engine(EngineConfig(**kw), clock if clock is not None else VirtualClock())
        await e.start()
        engines.append(e)
        return e

    try:
        yield make
    finally:
        for e in engines:
            await e.stop()


async def test_long_prefill_stretches_running_streams(engine_factory):
    e = await engine_factory(max_num_batched_tokens=8192)
    streams = [e.submit(GenRequest(f"s{i}", [10 + i] * 32, 120)) for i in range(4)]
    long_req = None

    async def watch():
        nonlocal long_req
        n = 0
        async for _ in streams[0]:
            n += 1
            if n == 30:  # 16000 new tokens: two chunks under a 8192-token budget
                long_req = e.submit(GenRequest("long", list(range(5000, 21000)), 4))

    await asyncio.gather(watch(), *(drain(s) for s in streams[1:]))
    assert long_req is not None
    await drain(long_req)
    g = gaps(streams[0].token_times)
    base = statistics.median(g)
    stretched = [i for i, x in enumerate(g) if x > 10 * base]
    assert len(stretched) == 2, (base, sorted(g)[-4:])
    assert stretched[1] == stretched[0] + 1  # consecutive chunks
    # the stretched gaps are the long prompt's chunks: its first token ends the second one
    assert long_req.token_times[0] == pytest.approx(streams[0].token_times[stretched[1] + 1])
    # every running stream saw the same stretch
    for s in streams[1:]:
        assert max(gaps(s.token_times)) > 10 * base


async def test_tpot_rises_with_batch_size(engine_factory):
    tpot = {}
    for batch in (1, 16, 64, 256):
        e = await engine_factory()
        hs = [e.submit(GenRequest(f"b{batch}-{i}", [7 + i] * 512, 24)) for i in range(batch)]
        await asyncio.gather(*(drain(h) for h in hs))
        tpot[batch] = statistics.mean(x for h in hs for x in gaps(h.token_times))
        assert e.snapshot().itl.count == batch * 23
    values = [tpot[b] for b in (1, 16, 64, 256)]
    assert values == sorted(values) and len(set(values)) == 4
    assert tpot[256] / tpot[1] > 1.5
    # batch 1 decodes cost what the table says at this context
    assert tpot[1] == pytest.approx(e.cost.decode_ms(1, 524) / 1000, rel=0.02)


async def test_max_num_seqs_and_token_budget_bound_each_step(engine_factory):
    e = Engine(EngineConfig(max_num_seqs=2, max_num_batched_tokens=1000), VirtualClock())
    sched = e.scheduler
    for i in range(4):
        e.submit(GenRequest(f"r{i}", [i + 1] * 700, 3))
    plan = sched.schedule()
    assert plan.nums == [700, 300]  # chunked: the second prompt gets the rest of the budget
    sched.commit(plan, plan.duration)
    plan = sched.schedule()
    assert plan.nums == [1, 400] and len(sched.running) == 2 and len(sched.waiting) == 2
    sched.commit(plan, 1.0)
    # r0: prefill token + 1 decode; r1: first token after its second chunk
    assert e.snapshot().generation_tokens_total == 3


async def test_preemption_when_kv_runs_out_and_outputs_survive(engine_factory):
    reqs = [GenRequest(f"r{i}", [100 + i] * 20, 50) for i in range(4)]
    roomy = await engine_factory(num_gpu_blocks=1000)
    expected = await asyncio.gather(*(drain(roomy.submit(r)) for r in reqs))
    assert roomy.snapshot().preemptions_total == 0

    # 10 blocks x 16 = 160 tokens, while the 4 requests grow to 4 x 70 = 280
    tight = await engine_factory(num_gpu_blocks=10)
    handles = [tight.submit(r) for r in reqs]
    peak = 0.0

    async def sample():
        nonlocal peak
        while any(h.finish_reason is None for h in handles):
            peak = max(peak, tight.snapshot().kv_usage)
            await asyncio.sleep(0)

    outs = await asyncio.gather(*(drain(h) for h in handles), sample())
    s = tight.snapshot()
    assert s.preemptions_total > 0
    assert sum(h.num_preemptions for h in handles) == s.preemptions_total
    assert outs[:4] == expected  # recomputed, not lost or changed
    assert all(h.finish_reason == "length" for h in handles)
    assert peak > 0.8 and s.kv_usage == 0.0
    # recompute costs time: the squeezed engine took longer for the same work
    assert max(h.token_times[-1] for h in handles) > roomy.clock.now()


def test_capacity_follows_from_memory_settings():
    # (141 GB x 0.9 - 16 GB) / (128 KiB per token x 16 tokens per block)
    assert compute_num_gpu_blocks(EngineConfig()) == int((141e9 * 0.9 - 16e9) // (131072 * 16))
    assert 52_000 < compute_num_gpu_blocks(EngineConfig()) < 54_000  # ~850k tokens
    base = EngineConfig(gpu_memory_gb=80, weights_gb=16)
    half_kv = EngineConfig(gpu_memory_gb=80, weights_gb=16, kv_bytes_per_token=65536)
    bigger_blocks = EngineConfig(gpu_memory_gb=80, weights_gb=16, block_size=32)
    n = compute_num_gpu_blocks(base)
    assert compute_num_gpu_blocks(half_kv) in (2 * n, 2 * n + 1)
    assert compute_num_gpu_blocks(bigger_blocks) == n // 2
    assert Engine(EngineConfig(num_gpu_blocks=7), VirtualClock()).kv.num_blocks == 7
    with pytest.raises(ValueError, match="KV cache"):
        compute_num_gpu_blocks(EngineConfig(gpu_memory_gb=16, weights_gb=16))


async def test_requests_beyond_capacity_or_context_get_clear_errors(engine_factory):
    e = await engine_factory(block_size=16, num_gpu_blocks=8, max_model_len=100)
    with pytest.raises(ValueError, match="maximum context length is 100"):
        e.submit(GenRequest("too-long", [1] * 100, 1))
    with pytest.raises(ValueError, match="empty"):
        e.submit(GenRequest("empty", [], 1))
    with pytest.raises(ValueError, match="max_tokens"):
        e.submit(GenRequest("zero", [1], 0))
    h = e.submit(GenRequest("capped", [1] * 90, 1000))  # generation capped at max_model_len
    assert len(await drain(h)) == 10 and h.finish_reason == "length"
    small = await engine_factory(block_size=16, num_gpu_blocks=4)  # 64 tokens of KV
    h = small.submit(GenRequest("kv-capped", [1] * 60, 1000))
    assert len(await drain(h)) == 4


async def test_abort_frees_blocks_and_ends_the_stream(engine_factory):
    e = await engine_factory(block_size=16, num_gpu_blocks=100, max_num_seqs=2)
    a = e.submit(GenRequest("a", list(range(1, 200)), 1000))
    b = e.submit(GenRequest("b", list(range(300, 400)), 1000))
    w = e.submit(GenRequest("w", list(range(500, 600)), 1000))  # waits: max_num_seqs=2
    it = aiter(a)
    for _ in range(5):
        await anext(it)
    s = e.snapshot()
    assert (s.running, s.waiting) == (2, 1)
    used = e.kv.num_used
    e.abort("a")
    e.abort("a")  # idempotent
    e.abort("nobody")
    assert a.finish_reason == "abort" and [t async for t in it] == []
    assert e.kv.num_used <= used - 13  # a's 13+ blocks are back
    e.abort("w")  # aborting a waiting request
    assert w.finish_reason == "abort" and await drain(w) == []
    e.abort("b")
    await drain(b)
    s = e.snapshot()
    assert (s.running, s.waiting, s.kv_usage) == (0, 0, 0.0)
    assert s.requests_finished_total == 3 and s.e2e.count == 0


async def test_stop_ends_every_stream(engine_factory):
    e = await engine_factory()
    hs = [e.submit(GenRequest(f"r{i}", [1, 2, 3], 10_000)) for i in range(3)]
    await anext(aiter(hs[0]))
    await e.stop()
    outs = await asyncio.gather(*(drain(h) for h in hs))
    assert all(h.finish_reason == "abort" for h in hs) and all(len(o) < 10_000 for o in outs)


async def test_output_tokens_are_deterministic_and_in_range(engine_factory):
    e1 = await engine_factory(seed=1)
    e2 = await engine_factory(seed=1)
    e3 = await engine_factory(seed=2)
    o1 = await drain(e1.submit(GenRequest("x", [5] * 10, 50)))
    o2 = await drain(e2.submit(GenRequest("x", [6] * 10, 50)))
    o3 = await drain(e3.submit(GenRequest("x", [5] * 10, 50)))
    other = await drain(e1.submit(GenRequest("y", [5] * 10, 50)))
    assert o1 == o2 and o1 != o3 and o1 != other
    assert all(1000 <= t < 30000 for t in o1 + o3) and len(set(o1)) > 40


async def test_histograms_are_cumulative_and_in_simulated_seconds(engine_factory):
    e = await engine_factory()
    hs = [e.submit(GenRequest(f"r{i}", [i + 1] * 4096, 5)) for i in range(2)]
    await asyncio.gather(*(drain(h) for h in hs))
    s = e.snapshot()
    assert s.ttft.count == 2 and s.itl.count == 8 and s.e2e.count == 2
    assert s.ttft.counts == sorted(s.ttft.counts) and s.ttft.counts[-1] <= s.ttft.count
    # both 4096-token prompts fit one 8192-token step: TTFT ~ a cold 8192 prefill
    ttft = hs[0].token_times[0] - hs[0].arrival_time
    assert s.ttft.sum == pytest.approx(2 * ttft)
    assert ttft == pytest.approx(e.cost.cold_prefill_ms(8192) / 1000, rel=0.01)
    i = next(k for k, b in enumerate(s.ttft.buckets) if b >= ttft)
    assert s.ttft.counts[i] == 2 and (i == 0 or s.ttft.counts[i - 1] == 0)


async def test_time_scale_stretches_wall_time(engine_factory):
    from loadtest.simulator.clock import RealClock

    k = 4.0
    e = await engine_factory(clock=RealClock(k), time_scale=k)
    h = e.submit(GenRequest("r", [1] * 16, 16))
    t0 = time.monotonic()
    await drain(h)
    wall = time.monotonic() - t0
    simulated = h.token_times[-1] - h.arrival_time  # model time: sum of the step durations
    ratio = wall / simulated
    # wall >= k x simulated by construction (the loop sleeps until each step's end);
    # the upper bound only guards against not scaling at all, with a wide noise margin
    assert 0.8 * k < ratio < 4 * k, ratio
    s = e.snapshot()
    assert s.steps_total == 16 and 0 < s.busy_fraction <= 1.0


async def test_lag_metric_reports_a_stalled_loop(engine_factory):
    from loadtest.simulator.clock import RealClock

    e = await engine_factory(clock=RealClock(1.0))
    h = e.submit(GenRequest("r", [1] * 16, 12))
    it = aiter(h)
    await anext(it)
    time.sleep(0.06)  # block the event loop: the step loop must wake >= ~54 ms late
    rest = [t async for t in it]
    s = e.snapshot()
    assert len(rest) == 11
    assert s.lag_max_seconds >= 0.04, s.lag_max_seconds
    # the schedule is caught up, so the simulated token times are unaffected
    g = gaps(h.token_times)
    assert max(g) < 2 * min(g)


async def test_max_loras_bounds_distinct_adapters_per_batch(engine_factory):
    e = Engine(EngineConfig(max_loras=1), VirtualClock())
    sched = e.scheduler
    e.submit(GenRequest("a", [1] * 8, 2, lora="A"))
    e.submit(GenRequest("b", [2] * 8, 2, lora="B"))
    e.submit(GenRequest("base", [3] * 8, 2))
    e.submit(GenRequest("a2", [4] * 8, 2, lora="A"))
    plan = sched.schedule()
    # B is skipped (one adapter already in the batch) but keeps its place in the queue
    assert [s.request_id for s in plan.seqs] == ["a", "base", "a2"]
    snap = e.snapshot()
    assert snap.running_loras == ["A"] and snap.waiting_loras == ["B"]
    steps = 0
    while "b" not in [s.request_id for s in plan.seqs]:
        assert all(s.lora != "B" for s in sched.running)
        sched.commit(plan, 0.0)
        plan = sched.schedule()
        steps += 1
    assert [s.request_id for s in plan.seqs] == ["b"] and steps == 2  # after A's are done


async def test_a_consumer_that_goes_away_aborts_its_request(engine_factory):
    e = await engine_factory(block_size=16, num_gpu_blocks=100)
    h = e.submit(GenRequest("gone", list(range(1, 100)), 10_000))
    it = aiter(h)
    await anext(it)
    assert e.kv.num_used > 0
    await it.aclose()
    assert h.finish_reason == "abort" and e.kv.num_used == 0
    h2 = e.submit(GenRequest("gone2", list(range(1, 100)), 10_000))
    async for _ in h2:
        break  # the iterator is dropped: finalized by the event loop soon after
    for _ in range(100):
        if h2.finish_reason is not None:
            break
        await asyncio.sleep(0)
    assert h2.finish_reason == "abort" and e.snapshot().running == 0
