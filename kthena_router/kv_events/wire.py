"""Decoding vLLM KV-event batches (msgpack), every shape vLLM has emitted.

vllm/distributed/kv_events.py: a ZMQ PUB message is `(topic, seq as 8 bytes big-endian,
payload)`; payload is a `KVEventBatch` `[ts, events, data_parallel_rank]` (positional;
older vLLM sent `[ts, events]`; a map `{"ts", "events", ...}` is accepted too). Each event
is a msgspec tagged Struct: a tagged array `["BlockStored", block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...]` before vLLM
PR #42892, a tagged map `{"type": "BlockStored", "block_hashes": ..., ...}` after it.
`BlockRemoved`: block_hashes, medium. `AllBlocksCleared`: nothing. Trailing defaulted
fields may be omitted (omit_defaults=True) and unknown fields are ignored. Hashes are
ints (low 64 bits of the digest) or, with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, digest
bytes; both become the 64-bit int. Token ids are not kept: the router hashes prompts itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from .hashing import fold_hash

MEDIUM_GPU = "GPU"


class DecodeError(ValueError):
    pass


@dataclass(slots=True)
class Stored:
    hashes: list[int]
    parent: int | None
    block_size: int | None
    lora_name: str | None
    medium: str | None


@dataclass(slots=True)
class Removed:
    hashes: list[int]
    medium: str | None


@dataclass(slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    ts: float
    events: list[Event]
    dp_rank: int | None
    unknown_events: int = 0


_decode = msgspec.msgpack.Decoder().decode  # untyped: both event shapes in one stream


def _hashes(v: Any) -> list[int]:
    if not isinstance(v, list):
        raise DecodeError("block_hashes is not a list")
    return [fold_hash(h) for h in v]


def _opt_hash(v: Any) -> int | None:
    return None if v is None else fold_hash(v)


def _event(raw: Any) -> Event | None:
    if isinstance(raw, dict):
        tag = raw.get("type")
        if tag == "BlockStored":
            return Stored(_hashes(raw.get("block_hashes")), _opt_hash(raw.get("parent_block_hash")),
                          raw.get("block_size"), raw.get("lora_name"), raw.get("medium"))
        if tag == "BlockRemoved":
            return Removed(_hashes(raw.get("block_hashes")), raw.get("medium"))
        if tag == "AllBlocksCleared":
            return Cleared()
        return None
    if isinstance(raw, list) and raw:
        tag, n = raw[0], len(raw)
        if tag == "BlockStored":
            if n < 5:
                raise DecodeError("BlockStored array too short")
            return Stored(_hashes(raw[1]), _opt_hash(raw[2]), raw[4],
                          raw[7] if n > 7 else None, raw[6] if n > 6 else None)
        if tag == "BlockRemoved":
            if n < 2:
                raise DecodeError("BlockRemoved array too short")
            return Removed(_hashes(raw[1]), raw[2] if n > 2 else None)
        if tag == "AllBlocksCleared":
            return Cleared()
        return None
    raise DecodeError(f"event is a {type(raw).__name__}")


def decode_batch(payload: bytes) -> Batch:
    """One KVEventBatch payload -> Batch; raises DecodeError on a malformed one."""
    try:
        raw = _decode(payload)
    except msgspec.DecodeError as e:
        raise DecodeError(str(e)) from e
    if isinstance(raw, list) and len(raw) >= 2:
        ts, evs, dp = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    elif isinstance(raw, dict):
        ts, evs, dp = raw.get("ts", 0.0), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise DecodeError("batch is neither [ts, events, ...] nor a map")
    if not isinstance(evs, list):
        raise DecodeError("events is not a list")
    events: list[Event] = []
    unknown = 0
    for r in evs:
        e = _event(r)
        if e is None:
            unknown += 1
        else:
            events.append(e)
    return Batch(float(ts or 0.0), events, dp if isinstance(dp, int) else None, unknown)


def on_device(medium: str | None) -> bool:
    """Events about the GPU prefix cache (None: vLLM before the `medium` field)."""
    return medium is None or medium.upper() == MEDIUM_GPU
