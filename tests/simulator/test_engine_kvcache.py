"""Paged KV cache: prefix-cache counters, LRU eviction, events, listing, reset."""

import asyncio

import pytest

from loadtest.simulator.clock import VirtualClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest
from loadtest.simulator.kvcache import KVCache, hash_block, root_hash


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def blocks_stored(self, block_hashes, parent_block_hash, token_ids, block_size, lora):
        self.events.append(("stored", list(block_hashes), parent_block_hash, list(token_ids), lora))

    def blocks_removed(self, block_hashes):
        self.events.append(("removed", list(block_hashes)))

    def all_blocks_cleared(self):
        self.events.append(("cleared",))


async def run(engine: Engine, rid: str, prompt: list[int], max_tokens: int = 1, lora=None):
    h = engine.submit(GenRequest(rid, prompt, max_tokens, lora))
    out = [t async for t in h]
    return h, out


@pytest.fixture
async def engine_factory():
    engines: list[Engine] = []

    async def make(**kw) -> Engine:
        e = Engine(EngineConfig(**kw), VirtualClock())
        await e.start()
        engines.append(e)
        return e

    try:
        yield make
    finally:
        for e in engines:
            await e.stop()


async def test_hit_and_query_counters_match_a_hand_worked_sequence(engine_factory):
    e = await engine_factory(block_size=4, num_gpu_blocks=64)
    # A: 10 prompt tokens, 3 generated. Queries 10, hits 0. Computed at the end: 12
    #    tokens (the last sampled token is never fed back) -> 3 full blocks cached:
    #    [1-4] [5-8] [9 10 o1 o2].
    a, a_out = await run(e, "A", list(range(1, 11)), 3)
    # B: shares blocks [1-4] [5-8], then differs. Queries 11, hits 8.
    b, _ = await run(e, "B", list(range(1, 9)) + [20, 21, 22])
    # C: exactly [1-8]: at most len-1 = 7 tokens may hit -> one block. Queries 8, hits 4.
    c, _ = await run(e, "C", list(range(1, 9)))
    # D: A's prompt + its first two generated tokens + 1: hits the generated block too.
    #    Queries 13, hits 12.
    d, _ = await run(e, "D", list(range(1, 11)) + a_out[:2] + [50])
    # E: B's prompt under a LoRA adapter: a separate hash chain. Queries 11, hits 0.
    f, _ = await run(e, "E", list(range(1, 9)) + [20, 21, 22], lora="x")
    assert [h.cached_tokens for h in (a, b, c, d, f)] == [0, 8, 4, 12, 0]
    s = e.snapshot()
    assert s.prefix_queries_total == 10 + 11 + 8 + 13 + 11
    assert s.prefix_hits_total == 0 + 8 + 4 + 12 + 0
    assert s.prompt_tokens_total == 10 + 11 + 8 + 13 + 11
    assert s.generation_tokens_total == 3 + 1 + 1 + 1 + 1
    assert s.kv_usage == 0.0


async def test_prefix_caching_off_counts_nothing_and_never_hits(engine_factory):
    e = await engine_factory(block_size=4, num_gpu_blocks=64, enable_prefix_caching=False)
    await run(e, "A", list(range(1, 11)), 3)
    b, _ = await run(e, "B", list(range(1, 11)))
    s = e.snapshot()
    assert b.cached_tokens == 0
    assert (s.prefix_queries_total, s.prefix_hits_total, s.cached_free_blocks) == (0, 0, 0)


def test_eviction_order_is_lru_on_the_block_pool():
    kv = KVCache(num_blocks=4, block_size=2)
    rec = Recorder()
    kv.add_listener(rec)
    blocks = {name: kv.allocate(1) for name in "ABCD"}
    hashes = {name: hash_block(root_hash(None), (i, i)) for i, name in enumerate("ABCD")}
    for name in "ABCD":
        kv.cache_blocks(blocks[name], [hashes[name]], None, [0, 0], None)
    assert kv.num_free == 0
    for name in "ACBD":  # freed in this order: A is least recently used
        kv.free(blocks[name])
    assert kv.eviction_order() == [hashes[n] for n in "ACBD"]
    # a hit on C takes it out of the free list; freeing it again makes it most recent
    found = kv.lookup([hashes["C"]])
    assert found == blocks["C"]
    kv.touch(found)
    kv.free(found)
    assert kv.eviction_order() == [hashes[n] for n in "ABDC"]
    rec.events.clear()
    kv.allocate(2)
    assert rec.events == [("removed", [hashes["A"], hashes["B"]])]
    assert sorted(kv.cached_block_hashes()) == sorted([hashes["D"], hashes["C"]])
    assert kv.lookup([hashes["A"]]) == [] and kv.evictions_total == 2


async def test_engine_evicts_least_recently_used_prefix_first(engine_factory):
    # 4 blocks of 4 tokens; 5-token prompts use 2 blocks each: one full (cached), one partial.
    e = await engine_factory(block_size=4, num_gpu_blocks=4)
    p = {name: [base + i for i in range(5)] for name, base in (("P1", 100), ("P2", 200), ("P3", 300))}
    for name in ("P1", "P2", "P3"):
        await run(e, name, p[name])
    h, _ = await run(e, "P1-again", p["P1"])  # touches P1's block: P1 is now most recent
    assert h.cached_tokens == 4
    assert e.snapshot().cached_free_blocks == 3
    await run(e, "Q", list(range(1000, 1009)))  # 3 blocks: 1 plain free + evicts P2, P3
    hits = {}
    for name in ("P1", "P2", "P3"):  # P1 first: it must not evict what we check next
        h, _ = await run(e, name + "-check", p[name])
        hits[name] = h.cached_tokens
    assert hits == {"P1": 4, "P2": 0, "P3": 0}
    assert e.snapshot().evictions_total >= 2


async def test_listener_sees_every_stored_and_removed_block(engine_factory):
    e = await engine_factory(block_size=4, num_gpu_blocks=6)
    rec = Recorder()
    e.kv.add_listener(rec)
    h, out = await run(e, "A", list(range(1, 10)), 4)  # 9 + 4 -> 12 computed -> 3 blocks
    stored = [ev for ev in rec.events if ev[0] == "stored"]
    # first chain link has no parent; tokens are the blocks' contents
    assert stored[0][2] is None and stored[0][3][:4] == [1, 2, 3, 4]
    all_tokens = list(range(1, 10)) + out
    flat = [t for ev in stored for t in ev[3]]
    assert flat == all_tokens[:12]
    chain = [x for ev in stored for x in ev[1]]
    assert sorted(chain) == sorted(e.kv.cached_block_hashes())
    # the parent of every later event is the last hash of the previous one
    for prev, cur in zip(stored, stored[1:]):
        assert cur[2] == prev[1][-1]
    await run(e, "B", list(range(500, 521)))  # 21 tokens: 6 blocks -> evicts all 3
    removed = [x for ev in rec.events if ev[0] == "removed" for x in ev[1]]
    assert sorted(removed) == sorted(chain)
    live = set(x for ev in rec.events if ev[0] == "stored" for x in ev[1]) - set(removed)
    assert live == set(e.kv.cached_block_hashes())


async def test_reset_prefix_cache_refused_while_busy_then_clears(engine_factory):
    e = await engine_factory(block_size=4, num_gpu_blocks=64)
    rec = Recorder()
    e.kv.add_listener(rec)
    await run(e, "A", list(range(1, 11)))
    h = e.submit(GenRequest("busy", list(range(50, 60)), 1000))
    it = aiter(h)
    await anext(it)
    assert e.reset_prefix_cache() is False
    e.abort("busy")
    assert [t async for t in it] is not None and h.finish_reason == "abort"
    assert e.reset_prefix_cache() is True
    assert rec.events[-1] == ("cleared",)
    assert e.kv.cached_block_hashes() == [] and e.snapshot().cached_free_blocks == 0
    b, _ = await run(e, "A2", list(range(1, 11)))
    assert b.cached_tokens == 0


async def test_identical_prompts_in_one_step_share_blocks(engine_factory):
    e = await engine_factory(block_size=16, num_gpu_blocks=100)
    prompt = list(range(1, 101))
    hs = [e.submit(GenRequest(f"r{i}", prompt, 2)) for i in range(3)]

    async def drain(h):
        return [t async for t in h]

    await asyncio.gather(*(drain(h) for h in hs))
    # the first registers 6 full blocks when scheduled; the others hit them in the same step
    assert [h.cached_tokens for h in hs] == [0, 96, 96]
