"""Decoding vLLM KV-event batches: hand-built with vLLM's own msgspec Struct layouts
(legacy tagged arrays and the current tagged maps), and the simulator's output decoded
with those layouts (so the simulator speaks vLLM's format, not just ours)."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from kthena_router.kv_events.wire import Cleared, DecodeError, Removed, Stored, decode_batch, on_device

MASK64 = (1 << 64) - 1


# --- vLLM's layouts (vllm/distributed/kv_events.py), legacy: everything array_like ------
class LegacyEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class LegacyStored(LegacyEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    lora_name: str | None = None


class LegacyRemoved(LegacyEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None


class LegacyCleared(LegacyEvent, tag="AllBlocksCleared"):
    pass


class LegacyBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[LegacyStored | LegacyRemoved | LegacyCleared]
    data_parallel_rank: int | None = None


# --- current: events are tagged maps (vLLM PR #42892), the batch stays positional ------
class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MapStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[str, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class MapRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class MapCleared(MapEvent, tag="AllBlocksCleared"):
    pass


class MapBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[MapStored | MapRemoved | MapCleared]
    data_parallel_rank: int | None = None


ENC = msgspec.msgpack.Encoder()


def test_legacy_array_batch():
    payload = ENC.encode(LegacyBatch(1.5, [
        LegacyStored([11, 12], None, list(range(32)), 16, None, "GPU"),
        LegacyStored([13], 12, list(range(16)), 16, 7, "GPU", "lora-a"),
        LegacyRemoved([11]),
        LegacyCleared(),
    ], 0))
    assert payload[:1] == b"\x93"  # fixarray(3): [ts, events, dp_rank]
    b = decode_batch(payload)
    assert b.ts == 1.5 and b.dp_rank == 0 and b.unknown_events == 0
    assert b.events == [
        Stored([11, 12], None, 16, None, "GPU"),
        Stored([13], 12, 16, "lora-a", "GPU"),
        Removed([11], None),
        Cleared(),
    ]


def test_oldest_layout_without_medium_and_rank():
    payload = ENC.encode([2.0, [["BlockStored", [1], None, [5, 6], 2, None], ["BlockRemoved", [1]]]])
    b = decode_batch(payload)
    assert b.dp_rank is None
    assert b.events == [Stored([1], None, 2, None, None), Removed([1], None)]


def test_map_batch_with_bytes_hashes_and_unknown_fields():
    d1, d2 = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    payload = ENC.encode(MapBatch(3.0, [
        MapStored([d1, d2], None, list(range(32)), 16, None, "GPU", None, [None, None], 0,
                  "full_attention"),
        MapRemoved([d1], "GPU", 0),
        MapCleared(),
    ], 1))
    b = decode_batch(payload)
    fold = lambda d: int.from_bytes(d, "big") & MASK64  # noqa: E731
    assert b.dp_rank == 1
    assert b.events == [Stored([fold(d1), fold(d2)], None, 16, None, "GPU"),
                        Removed([fold(d1)], "GPU"), Cleared()]


def test_unknown_event_is_counted_and_skipped():
    payload = ENC.encode([0.0, [{"type": "BlockPinned", "x": 1}, ["AllBlocksCleared"]], 0])
    b = decode_batch(payload)
    assert b.events == [Cleared()] and b.unknown_events == 1


@pytest.mark.parametrize("payload", [
    b"\xc1",  # never-used msgpack byte
    ENC.encode(5),
    ENC.encode([1.0, 7]),
    ENC.encode([1.0, [["BlockStored", 5, None]]]),
    ENC.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "x"}]]),
])
def test_malformed_batches_raise(payload):
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_medium_filter():
    assert on_device(None) and on_device("GPU") and not on_device("CPU")


@pytest.mark.parametrize("encoding,batch_type", [("map", MapBatch), ("array", LegacyBatch)])
def test_simulator_batches_decode_with_vllm_layouts(encoding, batch_type):
    """The simulator's payloads are valid vLLM batches in the chosen encoding."""
    from loadtest.simulator.kv_events import KvEventPublisher
    from loadtest.simulator.kvcache import KVCache, hash_block, root_hash

    kv = KVCache(4, 2)
    pub = KvEventPublisher(kv, encoding=encoding, replay_port=None)
    kv.add_listener(pub)  # no sockets: take the batch payload directly
    r = root_hash(None)
    h1 = hash_block(r, (1, 2))
    h2 = hash_block(h1, (3, 4))
    blocks = kv.allocate(2)
    kv.cache_blocks(blocks, [h1, h2], None, [1, 2, 3, 4], None)
    kv.free(blocks)
    kv.allocate(4)  # evicts both
    payload = pub.take_batch()
    assert payload is not None and pub.take_batch() is None
    typed = msgspec.msgpack.Decoder(batch_type).decode(payload)
    stored, removed = typed.events
    assert stored.token_ids == [1, 2, 3, 4] and stored.block_size == 2 and stored.parent_block_hash is None
    assert sorted(removed.block_hashes) == sorted(stored.block_hashes)
    assert decode_batch(payload).events[0].hashes == stored.block_hashes
