"""Random workloads on small caches: the scheduler's bookkeeping never breaks."""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.simulator.clock import VirtualClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest
from loadtest.simulator.scheduler import RUNNING

request = st.tuples(
    st.integers(0, 6),  # step at which it arrives
    st.integers(1, 60),  # prompt length
    st.integers(1, 40),  # max tokens
    st.integers(0, 3),  # prompt family: shared prefixes between requests
    st.sampled_from([None, None, "A", "B"]),
    st.booleans(),  # aborted a few steps after arrival
)


def check(e: Engine) -> None:
    kv, sched = e.kv, e.scheduler
    held = Counter(b for s in sched.running for b in s.blocks)
    assert all(kv._ref[b] == n for b, n in held.items())
    assert sum(kv._ref) == sum(held.values()) and kv.num_used == len(held)
    free = set(kv._free_plain) | set(kv._free_cached)
    assert len(free) == kv.num_free and not (free & set(held))
    assert all(kv._hash[b] == h for h, b in kv._by_hash.items())
    assert len(sched.running) <= e.config.max_num_seqs
    for s in sched.running:
        assert s.status == RUNNING and len(s.blocks) * kv.block_size >= s.num_computed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request, min_size=1, max_size=12),
    blocks=st.integers(8, 40),
    budget=st.integers(8, 64),
    max_seqs=st.integers(1, 6),
    caching=st.booleans(),
)
def test_random_workloads_keep_the_books_straight(reqs, blocks, budget, max_seqs, caching):
    e = Engine(
        EngineConfig(block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=budget,
                     max_num_seqs=max_seqs, enable_prefix_caching=caching, max_loras=1),
        VirtualClock(),
    )
    sched = e.scheduler
    handles, aborts = [], {}
    step = 0
    pending = sorted(enumerate(reqs), key=lambda x: x[1][0])
    while pending or sched.has_work():
        while pending and pending[0][1][0] <= step:
            i, (_, plen, mt, fam, lora, abort) = pending.pop(0)
            prompt = [fam * 1000 + k for k in range(plen)]
            if plen >= blocks * 4:  # never fits: refused up front
                try:
                    e.submit(GenRequest(f"r{i}", prompt, mt, lora))
                except ValueError:
                    continue
                raise AssertionError("a prompt larger than the KV cache was accepted")
            h = e.submit(GenRequest(f"r{i}", prompt, mt, lora))
            handles.append(h)
            if abort:
                aborts[f"r{i}"] = step + 3
        for rid, at in list(aborts.items()):
            if at == step:
                e.abort(rid)
        plan = sched.schedule()
        if plan is not None:
            assert 0 < sum(plan.nums) <= budget
            sched.commit(plan, float(step))
        check(e)
        step += 1
        assert step < 5000, "no progress"
    for h in handles:
        assert h.finish_reason in ("length", "abort")
        if h.finish_reason == "length":
            assert h.num_generated == h._seq.max_output
    assert e.kv.num_used == 0
    s = e.snapshot()
    assert s.prefix_hits_total <= s.prefix_queries_total
    assert s.requests_finished_total == len(handles)
