"""EndpointSubscriber against a scripted vLLM-style publisher (PUB + replay ROUTER) on
loopback: sequence gaps filled by replay, unrecoverable gaps, bad batches, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import msgspec
import pytest
import zmq
import zmq.asyncio

from kthena_router.kv_events import EndpointSubscriber, EventSource, OwnershipTable, StreamState

ENC = msgspec.msgpack.Encoder()


def stored(*hashes: int) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": [0] * len(hashes), "block_size": 1, "lora_id": None, "medium": "GPU",
            "lora_name": None}


def removed(*hashes: int) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


class ScriptedPublisher:
    """vLLM's ZmqEventPublisher protocol, with the test choosing what gets sent live."""

    def __init__(self, ctx: zmq.asyncio.Context, replay: bool = True) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: dict[int, bytes] = {}
        self.router = None
        self.replay_port = None
        self.task = None
        if replay:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.task = asyncio.create_task(self._serve())

    @property
    def source(self) -> EventSource:
        rep = None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"
        return EventSource(f"tcp://127.0.0.1:{self.port}", rep)

    def batch(self, seq: int, events: list[dict], live: bool = True, payload: bytes | None = None) -> None:
        data = payload if payload is not None else ENC.encode([float(seq), events, 0])
        self.buffer[seq] = data
        if live:
            self.pub.send_multipart((b"", seq.to_bytes(8, "big"), data))

    async def _serve(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            for seq in sorted(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart((ident, b"", seq.to_bytes(8, "big"), self.buffer[seq]))
            await self.router.send_multipart((ident, b"", (-1).to_bytes(8, "big", signed=True), b""))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def ctx():
    c = zmq.asyncio.Context()
    yield c
    c.destroy(linger=0)


async def start(pub: ScriptedPublisher, ctx, **kw):
    table = OwnershipTable()
    kw.setdefault("idle_replay_s", 60.0)  # no idle catch-up: gaps must show
    sub = EndpointSubscriber("e", pub.source, table, ctx=ctx, **kw)
    task = asyncio.create_task(sub.run())
    await until(lambda: sub.status.state is StreamState.UP, "stream up")
    await asyncio.sleep(0.1)  # let the subscription reach the PUB socket (slow joiner)
    return table, sub, task


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_gap_is_filled_from_replay(ctx):
    pub = ScriptedPublisher(ctx)
    table, sub, task = await start(pub, ctx)
    pub.batch(0, [stored(1, 2)])
    pub.batch(1, [stored(3)], live=False)  # lost on the PUB path
    pub.batch(2, [removed(1)])
    await until(lambda: sub.status.last_seq == 2, "seq 2")
    assert table.blocks("e") == {2, 3}
    assert sub.status.gaps == 1 and sub.status.gaps_unrecovered == 0
    assert table.is_up("e")
    await stop(task)
    await pub.close()


async def test_unrecoverable_gap_resyncs_without_phantoms(ctx):
    pub = ScriptedPublisher(ctx)
    table, sub, task = await start(pub, ctx)
    pub.batch(0, [stored(1, 2)])
    await until(lambda: sub.status.last_seq == 0, "seq 0")
    pub.batch(1, [removed(1)], live=False)
    pub.batch(2, [stored(5)], live=False)
    del pub.buffer[0], pub.buffer[1]  # the replay buffer has moved on past the gap
    pub.batch(3, [stored(6)])
    await until(lambda: sub.status.last_seq == 3, "seq 3")
    # block 1 was removed in the lost batch: it must not stay; 2 may be forgotten
    assert 1 not in table.blocks("e")
    assert table.blocks("e") == {5, 6}
    assert sub.status.gaps_unrecovered == 1
    await stop(task)
    await pub.close()


async def test_gap_without_replay_clears(ctx):
    pub = ScriptedPublisher(ctx, replay=False)
    table, sub, task = await start(pub, ctx)
    pub.batch(0, [stored(1, 2)])
    await until(lambda: sub.status.last_seq == 0, "seq 0")
    pub.batch(1, [removed(1)], live=False)
    pub.batch(2, [stored(7)])
    await until(lambda: sub.status.last_seq == 2, "seq 2")
    assert table.blocks("e") == {7}
    await stop(task)
    await pub.close()


async def test_bad_batch_clears_and_late_join_replays_history(ctx):
    pub = ScriptedPublisher(ctx)
    pub.batch(0, [stored(1, 2)], live=False)  # published before the router subscribed
    pub.batch(1, [stored(3)], live=False)
    table, sub, task = await start(pub, ctx)
    await until(lambda: table.blocks("e") == {1, 2, 3}, "history replayed")
    pub.batch(2, [], payload=b"\xc1")
    await until(lambda: sub.status.decode_errors == 1, "decode error")
    assert table.blocks("e") == frozenset()
    await stop(task)
    await pub.close()


async def test_publisher_gone_marks_stream_down(ctx):
    pub = ScriptedPublisher(ctx)
    seen: list[StreamState] = []
    table, sub, task = await start(pub, ctx)
    sub._on_status = lambda st: seen.append(st.state)
    pub.batch(0, [stored(1)])
    await until(lambda: table.blocks("e") == {1}, "block 1")
    await pub.close()
    await until(lambda: sub.status.state is StreamState.DOWN, "stream down")
    assert not table.is_up("e") and seen[-1] is StreamState.DOWN
    await stop(task)
