"""The hub's KV-event mirror (podstate/kv_relay.py): what a (re)connecting worker gets, and
how a worker applies KV ops to its matcher's sink."""

from __future__ import annotations

import asyncio

from kthena_router.podstate import wire
from kthena_router.podstate.kv_relay import HubKvSink, apply_ops


class Sink:
    def __init__(self) -> None:
        self.blocks: dict[str, list[int]] = {}
        self.up: dict[str, bool] = {}

    def stored(self, ep: str, hashes: list[int]) -> None:
        self.blocks.setdefault(ep, []).extend(hashes)

    def removed(self, ep: str, hashes: list[int]) -> None:
        self.blocks[ep] = [h for h in self.blocks.get(ep, []) if h not in hashes]

    def cleared(self, ep: str) -> None:
        self.blocks.pop(ep, None)

    def set_stream_up(self, ep: str, up: bool) -> None:
        self.up[ep] = up


def frames_ops(frames: list[bytes]) -> list[wire.KvOp]:
    ops: list[wire.KvOp] = []
    for f in frames:
        size, kind = wire.parse_header(f[:wire.HEADER.size])
        assert kind == wire.KV and size == len(f) - wire.HEADER.size
        ops.extend(wire.decode_kv(f[wire.HEADER.size:]))
    return ops


def test_changes_go_out_in_one_frame_per_loop_turn_and_the_mirror_welcomes_late_workers() -> None:
    sent: list[bytes] = []
    hub = HubKvSink(sent.append)

    async def feed() -> None:
        hub.set_stream_up("a:1", True)
        hub.stored("a:1", [1, 2, 3])
        hub.removed("a:1", [2])
        hub.stored("b:2", [9])
        hub.cleared("b:2")
        hub.set_stream_up("b:2", False)
        await asyncio.sleep(0)

    asyncio.run(feed())
    assert len(sent) == 1
    live = Sink()
    apply_ops(frames_ops(sent), live)
    assert live.blocks == {"a:1": [1, 3]} and live.up == {"a:1": True, "b:2": False}

    late = Sink()
    late.blocks["a:1"] = [77]  # stale content from before the worker restarted
    welcome = hub.welcome()
    assert welcome is not None
    up: dict[str, bool] = {}
    apply_ops(frames_ops([welcome]), late, up=up)
    assert late.blocks == live.blocks and late.up == live.up == up

    hub.forget(["b:2"])  # a:1 left every worker's endpoint set
    assert hub.blocks == {} and hub.up == {"b:2": False}
