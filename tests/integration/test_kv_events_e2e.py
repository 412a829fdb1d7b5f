"""Simulator engine -> vLLM-format KV events over ZMQ (loopback) -> router ownership table.

The engine is the real Engine (RealClock, fast time scale); its publisher hashes blocks
with the simulator's vLLM hash implementation, the router side with its own. After a
workload with shared prefixes, LoRA and evictions the table must equal the engine's true
cache content, and the router's prompt hashes must find exactly the engine's cached prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kthena_router.kv_events import BlockHasher, EndpointSubscriber, EventSource, OwnershipTable, StreamState
from loadtest.simulator.clock import RealClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest
from loadtest.simulator.kv_events import KvEventPublisher
from loadtest.simulator.kvcache import hash_block, root_hash

REPO = Path(__file__).resolve().parents[2]
BS = 4


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def workload(seed: int, n: int) -> list[tuple[list[int], str | None]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 50_000) for _ in range(rng.randrange(8, 40))] for _ in range(4)]
    out = []
    for i in range(n):
        tail = [rng.randrange(100, 50_000) for _ in range(rng.randrange(1, 30))]
        out.append((prefixes[i % 4] + tail, "lora-a" if i % 7 == 0 else None))
    return out


async def run_requests(eng: Engine, reqs: list[tuple[list[int], str | None]], tag: str) -> None:
    async def one(i: int, prompt: list[int], lora: str | None) -> None:
        async for _ in eng.submit(GenRequest(f"{tag}{i}", prompt, 6, lora=lora)):
            pass

    await asyncio.gather(*(one(i, p, lo) for i, (p, lo) in enumerate(reqs)))


def engine_cached_blocks(eng: Engine, prompt: list[int], lora: str | None) -> int:
    """How many leading full blocks of `prompt` the engine holds (its own hashes)."""
    parent, hashes = root_hash(lora), []
    for i in range(len(prompt) // BS):
        parent = hash_block(parent, tuple(prompt[i * BS:(i + 1) * BS]))
        hashes.append(parent)
    return len(eng.kv.lookup(hashes))


@contextlib.asynccontextmanager
async def engine_with_publisher() -> AsyncIterator[tuple[Engine, KvEventPublisher]]:
    # not a fixture: the engine's tasks must live on the test's own event loop
    eng = Engine(EngineConfig(num_gpu_blocks=96, block_size=BS, max_num_seqs=16,
                              max_num_batched_tokens=512), RealClock(0.02))
    pub = KvEventPublisher(eng.kv, host="127.0.0.1")
    await pub.start()
    await eng.start()
    try:
        yield eng, pub
    finally:
        await eng.stop()
        await pub.close()


async def subscribe(pub: KvEventPublisher, table: OwnershipTable) -> tuple[EndpointSubscriber, asyncio.Task]:
    sub = EndpointSubscriber("e0", EventSource(pub.pub_address, pub.replay_address), table,
                             idle_replay_s=0.1)
    task = asyncio.create_task(sub.run())
    await until(lambda: sub.status.state is StreamState.UP, "stream up")
    return sub, task


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("late_join", [False, True], ids=["live", "late-join-replay"])
async def test_table_equals_engine_cache(late_join):
    async with engine_with_publisher() as (eng, pub):
        await check_table_equals_engine_cache(eng, pub, late_join)


async def check_table_equals_engine_cache(eng: Engine, pub: KvEventPublisher, late_join: bool) -> None:
    table = OwnershipTable()
    reqs = workload(7, 80)
    if late_join:  # the engine works before the router subscribes: history comes by replay
        await run_requests(eng, reqs[:40], "early")
        sub, task = await subscribe(pub, table)
        await run_requests(eng, reqs[40:], "late")
    else:
        sub, task = await subscribe(pub, table)
        await run_requests(eng, reqs, "r")
    truth = pub.cache_content()
    await until(lambda: sub.status.last_seq == truth["last_seq"], "subscriber caught up")
    assert eng.kv.evictions_total > 0, "the workload must evict"
    assert truth["unmapped"] == 0 and truth["num_blocks"] == eng.kv.num_cached_blocks > 0
    assert table.blocks("e0") == set(truth["blocks"])
    assert table.is_up("e0")

    # the router's own hashing of a prompt finds exactly the engine's cached prefix
    hasher = BlockHasher(BS, "sha256_cbor", "0")
    hits = 0
    for prompt, lora in reqs[-12:] + workload(99, 4):
        got = table.match(["e0"], hasher.hashes(prompt, lora_name=lora))["e0"]
        assert got == engine_cached_blocks(eng, prompt, lora)
        hits += got > 0
    assert hits > 0
    await stop(task)


async def test_reset_prefix_cache_clears_table():
    async with engine_with_publisher() as (eng, pub):
        await check_reset_clears(eng, pub)


async def check_reset_clears(eng: Engine, pub: KvEventPublisher) -> None:
    table = OwnershipTable()
    sub, task = await subscribe(pub, table)
    await run_requests(eng, workload(3, 10), "r")
    await until(lambda: sub.status.last_seq == pub.last_seq and table.num_entries() > 0, "blocks")
    assert eng.reset_prefix_cache()
    truth = pub.cache_content()
    await until(lambda: sub.status.last_seq == truth["last_seq"], "clear event")
    assert truth["blocks"] == [] and table.blocks("e0") == frozenset()
    await stop(task)


CHILD = r"""
import asyncio, json, sys
from loadtest.simulator.clock import RealClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest
from loadtest.simulator.kv_events import KvEventPublisher

async def main():
    eng = Engine(EngineConfig(num_gpu_blocks=64, block_size=4), RealClock(0.02))
    pub = KvEventPublisher(eng.kv, host="127.0.0.1")
    await pub.start()
    await eng.start()
    async for _ in eng.submit(GenRequest("r0", list(range(100, 140)), 4)):
        pass
    print(json.dumps({"pub": pub.pub_address, "replay": pub.replay_address}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_killed_engine_process_marks_stream_down():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)  # type: ignore[union-attr]
        addr = json.loads(line)
        table = OwnershipTable()
        sub = EndpointSubscriber("e0", EventSource(addr["pub"], addr["replay"]), table, idle_replay_s=0.1)
        task = asyncio.create_task(sub.run())
        await until(lambda: table.is_up("e0") and len(table.blocks("e0")) == 10, "history replayed")
        proc.send_signal(signal.SIGKILL)
        await until(lambda: sub.status.state is StreamState.DOWN, "stream down")
        assert not table.is_up("e0")
        await stop(task)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
