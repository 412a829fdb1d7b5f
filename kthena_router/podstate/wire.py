"""Frames between the pod-state hub and the workers (one unix stream socket per worker).

Frame: u32 big-endian length of what follows, u8 type, payload. Payloads are msgpack
except INSERTS, whose compact binary records the hub relays to the other workers without
decoding: repeated [u16 key length][key utf-8][u32 n][n x u64 little-endian block hash].
The hashes travel as bytes end to end (`BlockHashes.to_bytes()` / `BlockHashes.from_bytes`):
no Python int per block on either side.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from kthena_router.engine_state.snapshot import EndpointSnapshot

HELLO, TARGETS, INSERTS, SNAPSHOT, PROBES, KV, FLIGHT = 1, 2, 3, 4, 5, 6, 7
# KV ops: an engine stored / removed blocks, dropped everything, its stream went up / down
KV_STORED, KV_REMOVED, KV_CLEARED, KV_UP, KV_DOWN = 1, 2, 3, 4, 5
MAX_FRAME = 64 * 1024 * 1024  # a larger length means a corrupt stream: drop the connection
HEADER = struct.Struct(">IB")
_KLEN, _COUNT = struct.Struct("<H"), struct.Struct("<I")

SSL_NONE, SSL_VERIFY, SSL_INSECURE = 0, 1, 2


class FrameError(ValueError):
    pass


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload) + 1, kind) + payload


def parse_header(head: bytes) -> tuple[int, int]:
    """(payload length, type) of a 5-byte header."""
    length, kind = HEADER.unpack(head)
    if length < 1 or length > MAX_FRAME:
        raise FrameError(f"bad frame length {length}")
    return length - 1, kind


# --- INSERTS ---------------------------------------------------------------------------
def encode_insert(key: str, hashes: bytes) -> bytes:
    """One record: `key` (endpoint "ip:port") holds this chain of block hashes, given as
    little-endian u64 words (`BlockHashes.to_bytes()`)."""
    if len(hashes) % 8:
        raise ValueError("block hashes must be little-endian u64 words")
    kb = key.encode()
    return _KLEN.pack(len(kb)) + kb + _COUNT.pack(len(hashes) // 8) + hashes


def decode_inserts(payload: bytes | memoryview) -> Iterator[tuple[str, bytes]]:
    """The records of an INSERTS payload, in order: (key, chain as little-endian u64 words,
    for `BlockHashes.from_bytes`). FrameError on a truncated record."""
    view = memoryview(payload)
    pos, end = 0, len(view)
    while pos < end:
        if pos + 2 > end:
            raise FrameError("truncated insert record")
        (klen,) = _KLEN.unpack_from(view, pos)
        pos += 2
        if pos + klen + 4 > end:
            raise FrameError("truncated insert record")
        key = bytes(view[pos:pos + klen]).decode()
        pos += klen
        (n,) = _COUNT.unpack_from(view, pos)
        pos += 4
        if pos + 8 * n > end:
            raise FrameError("truncated insert record")
        yield key, bytes(view[pos:pos + 8 * n])
        pos += 8 * n


# --- TARGETS -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProbeTarget:
    key: str
    base_url: str
    headers: tuple[tuple[str, str], ...] = ()
    ssl: int = SSL_NONE  # SSL_VERIFY / SSL_INSECURE for https endpoints


@dataclass(frozen=True, slots=True)
class ScrapeSpec:
    key: str
    base_url: str
    flavour: str


@dataclass(frozen=True, slots=True)
class KvSpec:
    """An engine's KV-event stream (kv_events.EventSource) for the endpoint `key`."""
    key: str
    pub: str
    replay: str | None = None
    topic: str = ""


@dataclass(frozen=True, slots=True)
class Targets:
    """A worker's endpoint sets: every endpoint to probe, and (router configuration only)
    every endpoint to scrape and (kvcache-aware) every KV-event stream to follow. The hub
    serves the union over its live workers."""
    probe: tuple[ProbeTarget, ...] = ()
    scrape: tuple[ScrapeSpec, ...] = ()
    kv: tuple[KvSpec, ...] = ()


KvOp = tuple[int, str, list[int]]  # (KV_* op, endpoint key, block hashes or [])


_targets_dec = msgspec.msgpack.Decoder(Targets)
_snap_dec = msgspec.msgpack.Decoder(EndpointSnapshot)
_probes_dec = msgspec.msgpack.Decoder(list[tuple[str, bool]])
_hello_dec = msgspec.msgpack.Decoder(dict[str, Any])
_kv_dec = msgspec.msgpack.Decoder(list[tuple[int, str, list[int]]])
_flight_dec = msgspec.msgpack.Decoder(list[tuple[str, int]])
_enc = msgspec.msgpack.Encoder()


def encode_targets(t: Targets) -> bytes:
    return _enc.encode(t)


def decode_targets(b: bytes) -> Targets:
    return _targets_dec.decode(b)


def encode_snapshot(s: EndpointSnapshot) -> bytes:
    return _enc.encode(s)


def decode_snapshot(b: bytes) -> EndpointSnapshot:
    return _snap_dec.decode(b)


def encode_probes(results: Iterable[tuple[str, bool]]) -> bytes:
    return _enc.encode(list(results))


def decode_probes(b: bytes) -> list[tuple[str, bool]]:
    return _probes_dec.decode(b)


def encode_kv(ops: Iterable[KvOp]) -> bytes:
    return _enc.encode(list(ops))


def decode_kv(b: bytes) -> list[KvOp]:
    return _kv_dec.decode(b)


LORA_SEP = "\x01"  # in a FLIGHT key: never in an endpoint key


def flight_key(ep_key: str, lora: str = "") -> str:
    """A FLIGHT entry's key: the endpoint's, or with `lora` the endpoint's attempts for that
    adapter (counted besides the endpoint's total, which has its own entry)."""
    return f"{ep_key}{LORA_SEP}{lora}" if lora else ep_key


def split_flight_key(key: str) -> tuple[str, str]:
    """(endpoint key, LoRA adapter or "")."""
    ep_key, _, lora = key.partition(LORA_SEP)
    return ep_key, lora


def encode_flight(deltas: Iterable[tuple[str, int]]) -> bytes:
    """FLIGHT: (`flight_key`, attempts started minus ended there) since the last frame."""
    return _enc.encode(list(deltas))


def decode_flight(b: bytes) -> list[tuple[str, int]]:
    return _flight_dec.decode(b)


def encode_hello(pid: int) -> bytes:
    return _enc.encode({"pid": pid})


def decode_hello(b: bytes) -> dict[str, Any]:
    return _hello_dec.decode(b)


def decode_error() -> tuple[type[Exception], ...]:
    """Exceptions a payload decoder raises on garbage."""
    return (msgspec.DecodeError, msgspec.ValidationError, FrameError, UnicodeDecodeError)
