"""KV-cache events in vLLM's wire format, published over ZMQ by a simulated engine.

Facts this module follows (read from vLLM's source):

vllm/distributed/kv_events.py
- `KVEventBatch(ts: float, events: list[...], data_parallel_rank: int | None = None)`;
  the outer batch is a positional msgpack array `[ts, events, dp_rank]`.
- Events are msgspec Structs with `tag=True`: `BlockStored(block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys=None, group_idx=None, ...)`,
  `BlockRemoved(block_hashes, medium, group_idx=None)`, `AllBlocksCleared()`.
  Until vLLM PR #42892 they were `array_like=True` (tagged arrays `["BlockStored", ...]`);
  since then each event is a tagged map `{"type": "BlockStored", "block_hashes": ...}`.
  `encoding="map"` (default) emits the current form, `"array"` the legacy one.
- `ZmqEventPublisher`: PUB socket, multipart `(topic, seq.to_bytes(8, "big"), payload)`,
  seq counting from 0 per publisher; a ROUTER replay socket answers a request
  `[identity, b"", start_seq (8 bytes big-endian)]` with `[identity, b"", seq, payload]`
  for every buffered batch with seq >= start_seq, then `[identity, b"", -1 (8 bytes,
  signed), b""]`. The buffer keeps the last `buffer_steps` (10000) batches.
  medium is "GPU" for the device cache.

vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py
- `hash_block_tokens(hash_fn, parent, tokens, extra_keys) = hash_fn((parent or NONE_HASH,
  tuple(tokens), extra_keys))`, chained over full blocks only; the chain carries the full
  digest (32 bytes for sha256).
- `NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))` (the seed *string*); random when unset,
  so a router can only reproduce hashes of engines started with a fixed PYTHONHASHSEED.
- `extra_keys`: `(lora_name,)` for every block of a LoRA request (plus mm/cache_salt keys,
  not simulated), else None.
- `sha256_cbor(x) = sha256(cbor2.dumps(x, canonical=True))`; `sha256(x) =
  sha256(pickle.dumps(x, protocol=HIGHEST_PROTOCOL))` (vLLM's default algo);
  xxhash variants use xxh3_128 (not implemented here).
- Event hash (`maybe_convert_block_hash`, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 default):
  `int.from_bytes(digest, "big") & (2**64 - 1)`, i.e. the digest's last 8 bytes.

The simulator's KV cache keeps its own internal hashes (kvcache.py); this publisher maps
each internal hash to the vLLM digest when the block is stored (the parent's digest is
known because a sequence's blocks are stored in order) and keeps that map for removals.
This is the simulator's own implementation; the router has an independent one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import pickle
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
import zmq
import zmq.asyncio

from .kvcache import KVCache

log = logging.getLogger("loadtest.simulator.kv_events")

HashAlgo = Literal["sha256_cbor", "sha256"]
Encoding = Literal["map", "array"]
MASK64 = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


# --- vLLM block hashing (simulator side) --------------------------------------------
def _cbor_head(major: int, n: int, out: bytearray) -> None:
    m = major << 5
    if n < 24:
        out.append(m | n)
    elif n < 0x100:
        out += bytes((m | 24, n))
    elif n < 0x10000:
        out.append(m | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(m | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(m | 27)
        out += n.to_bytes(8, "big")


def _cbor(x: Any, out: bytearray) -> None:
    """Canonical CBOR for the types a block key holds (as cbor2 canonical=True)."""
    if x is None:
        out.append(0xF6)
    elif isinstance(x, bool):
        out.append(0xF5 if x else 0xF4)
    elif isinstance(x, int):
        if x >= 0:
            _cbor_head(0, x, out)
        else:
            _cbor_head(1, -1 - x, out)
    elif isinstance(x, bytes):
        _cbor_head(2, len(x), out)
        out += x
    elif isinstance(x, str):
        b = x.encode()
        _cbor_head(3, len(b), out)
        out += b
    elif isinstance(x, (tuple, list)):
        _cbor_head(4, len(x), out)
        for item in x:
            _cbor(item, out)
    else:
        raise TypeError(f"no CBOR encoding for {type(x).__name__}")


def sha256_cbor(x: Any) -> bytes:
    buf = bytearray()
    _cbor(x, buf)
    return hashlib.sha256(buf).digest()


def sha256_pickle(x: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()


class VllmBlockHasher:
    """vLLM's prefix-cache block hash chain with a fixed hash seed (PYTHONHASHSEED)."""

    def __init__(self, algo: HashAlgo = "sha256_cbor", hash_seed: str = "0") -> None:
        if algo == "sha256_cbor":
            self._fn = sha256_cbor
        elif algo == "sha256":
            self._fn = sha256_pickle
        else:
            raise ValueError(f"unsupported hash algo {algo!r}")
        self.algo = algo
        self.hash_seed = hash_seed
        self.none_hash = self._fn(hash_seed)

    def block(self, parent: bytes | None, tokens: Sequence[int], lora: str | None) -> bytes:
        extra = (lora,) if lora is not None else None
        return self._fn((parent or self.none_hash, tuple(tokens), extra))

    def chain(self, tokens: Sequence[int], block_size: int, lora: str | None = None) -> list[bytes]:
        """Digests of every full block of `tokens` (a request's view)."""
        out: list[bytes] = []
        parent: bytes | None = None
        for i in range(len(tokens) // block_size):
            parent = self.block(parent, tokens[i * block_size:(i + 1) * block_size], lora)
            out.append(parent)
        return out


def external_hash(digest: bytes) -> int:
    """The 64-bit hash vLLM puts in events (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)."""
    return int.from_bytes(digest, "big") & MASK64


def _lora_id(name: str) -> int:
    # vLLM's lora_int_id is assigned at load; any stable positive id does for the simulator
    return (zlib.crc32(name.encode()) & 0x7FFFFFFF) or 1


# --- publisher ----------------------------------------------------------------------
class KvEventPublisher:
    """Listens to one engine's KVCache and publishes vLLM KVEventBatch messages.

    Events of one engine step are collected by the (synchronous) listener calls and sent
    as one batch from a `call_soon` callback, i.e. when the step loop next yields. PUB
    sends never wait (ZMQ queues, and drops past the high-water mark, as vLLM's PUB does).
    Call `start()` before the engine caches anything: earlier blocks cannot be mapped.
    """

    def __init__(
        self,
        kv: KVCache,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        replay_port: int | None = 0,
        topic: str = "kv-events",
        hasher: VllmBlockHasher | None = None,
        encoding: Encoding = "map",
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
    ) -> None:
        self.kv = kv
        self.host = host
        self.port = port
        self.replay_port = replay_port
        self.topic = topic.encode()
        self.hasher = hasher or VllmBlockHasher()
        self.encoding = encoding
        self.dp_rank = data_parallel_rank
        self._hwm = hwm
        self._ext: dict[int, bytes] = {}  # internal hash -> vLLM digest, for cached blocks
        # digests of recently removed blocks: a sequence whose block duplicated another
        # one's content names that (possibly evicted) hash as its next block's parent
        self._retired: OrderedDict[int, bytes] = OrderedDict()
        self._retired_cap = max(1024, kv.num_blocks)
        self._pending: list[Any] = []
        self._flush_scheduled = False
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._enc = msgspec.msgpack.Encoder()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._pub: zmq.Socket[bytes] | None = None  # plain socket: sends never await
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.unmapped_parents = 0  # stored blocks whose parent digest was unknown (skipped)
        self.batches_sent = 0

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        if self._pub is not None:
            return
        if self.kv.num_cached_blocks:
            raise RuntimeError("attach the KV event publisher before the cache holds blocks")
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.Context()
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self._hwm)
        pub.setsockopt(zmq.LINGER, 0)
        self.port = _bind(pub, self.host, self.port)
        self._pub = pub
        if self.replay_port is not None:
            router = zmq.asyncio.Context.shadow(self._ctx.underlying).socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            self.replay_port = _bind(router, self.host, self.replay_port)
            self._router = router
            self._replay_task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")
        self.kv.add_listener(self)

    async def close(self) -> None:
        """Stop publishing (subscribers see the connection drop)."""
        with contextlib.suppress(ValueError):
            self.kv.remove_listener(self)
        task, self._replay_task = self._replay_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for s in (self._pub, self._router):
            if s is not None:
                s.close(linger=0)
        self._pub = self._router = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    @property
    def pub_address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def replay_address(self) -> str | None:
        return None if self.replay_port is None else f"tcp://{self.host}:{self.replay_port}"

    @property
    def last_seq(self) -> int:
        """Sequence number of the last batch sent (-1: none yet)."""
        return self._seq - 1

    # --- KVCacheListener ------------------------------------------------------------
    def blocks_stored(self, block_hashes: list[int], parent_block_hash: int | None,
                      token_ids: list[int], block_size: int, lora: str | None) -> None:
        parent: bytes | None = None
        if parent_block_hash is not None:
            parent = self._ext.get(parent_block_hash) or self._retired.get(parent_block_hash)
            if parent is None:  # should not happen; never publish a wrong chain
                self.unmapped_parents += len(block_hashes)
                log.warning("KV events: parent of %d stored blocks is unknown", len(block_hashes))
                return
        ext_parent = None if parent is None else external_hash(parent)
        digests: list[int] = []
        block = self.hasher.block
        for i, h in enumerate(block_hashes):
            parent = block(parent, token_ids[i * block_size:(i + 1) * block_size], lora)
            self._ext[h] = parent
            digests.append(external_hash(parent))
        extra = [(lora,) if lora is not None else None] * len(block_hashes)
        self._add(("BlockStored", {
            "block_hashes": digests, "parent_block_hash": ext_parent,
            "token_ids": list(token_ids), "block_size": block_size,
            "lora_id": None if lora is None else _lora_id(lora), "medium": MEDIUM_GPU,
            "lora_name": lora, "extra_keys": extra, "group_idx": 0,
        }))

    def blocks_removed(self, block_hashes: list[int]) -> None:
        out: list[int] = []
        retired = self._retired
        for h in block_hashes:
            d = self._ext.pop(h, None)
            if d is None:
                continue  # its store was never published (see unmapped_parents)
            out.append(external_hash(d))
            retired[h] = d
            retired.move_to_end(h)
        while len(retired) > self._retired_cap:
            retired.popitem(last=False)
        if out:
            self._add(("BlockRemoved", {"block_hashes": out, "medium": MEDIUM_GPU, "group_idx": 0}))

    def all_blocks_cleared(self) -> None:
        self._ext.clear()
        self._retired.clear()
        self._add(("AllBlocksCleared", {}))

    # --- admin view -----------------------------------------------------------------
    def cache_content(self) -> dict[str, Any]:
        """The engine's true cache content as event hashes (for GET /admin/engines/{i}/cache).

        `last_seq` is the last batch sent, which already covers every block listed here
        once pending events are flushed (done here), so a subscriber that has applied
        batch `last_seq` should hold exactly `blocks`.
        """
        self._flush()
        ext = self._ext
        blocks = sorted(external_hash(ext[h]) for h in self.kv.cached_block_hashes() if h in ext)
        return {
            "block_size": self.kv.block_size,
            "hash_algo": self.hasher.algo,
            "hash_seed": self.hasher.hash_seed,
            "num_blocks": len(blocks),
            "unmapped": self.kv.num_cached_blocks - len(blocks),
            "last_seq": self.last_seq,
            "pub": self.pub_address,
            "replay": self.replay_address,
            "blocks": blocks,
        }

    # --- sending --------------------------------------------------------------------
    def _add(self, event: tuple[str, dict[str, Any]]) -> None:
        self._pending.append(event)
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _encode_event(self, tag: str, fields: dict[str, Any]) -> Any:
        if self.encoding == "map":
            return {"type": tag, **fields}
        # legacy array_like layout: tag, then the fields in declaration order
        if tag == "BlockStored":
            return [tag, fields["block_hashes"], fields["parent_block_hash"], fields["token_ids"],
                    fields["block_size"], fields["lora_id"], fields["medium"],
                    fields["lora_name"], fields["extra_keys"], fields["group_idx"]]
        if tag == "BlockRemoved":
            return [tag, fields["block_hashes"], fields["medium"], fields["group_idx"]]
        return [tag]

    def take_batch(self) -> bytes | None:
        """Encode the pending events as one KVEventBatch payload (None if there are none)."""
        if not self._pending:
            return None
        events = [self._encode_event(t, f) for t, f in self._pending]
        self._pending = []
        return self._enc.encode([time.time(), events, self.dp_rank])

    def _flush(self) -> None:
        self._flush_scheduled = False
        payload = self.take_batch()
        if payload is None or self._pub is None:
            return
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        try:
            # a PUB socket never blocks: with no peer or past HWM the message is dropped
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload),
                                     flags=zmq.NOBLOCK)
            self.batches_sent += 1
        except zmq.ZMQError as e:
            log.warning("KV events: batch %d not sent: %s", seq, e)

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                log.warning("KV events: invalid replay request (%d frames)", len(frames))
                continue
            ident, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await router.send_multipart((ident, b"", seq.to_bytes(8, "big"), payload))
            await router.send_multipart((ident, b"", END_SEQ, b""))


def _bind(sock: zmq.Socket, host: str, port: int) -> int:
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    sock.bind(f"tcp://{host}:{port}")
    return port


def kv_events_ports(port_base: int, engine_index: int, dp_rank: int, dp_ranks: int) -> tuple[int, int]:
    """(PUB port, replay port) of one engine's DP rank: base + 2*(index*dp_ranks + rank), +1."""
    pub = port_base + 2 * (engine_index * dp_ranks + dp_rank)
    return pub, pub + 1


__all__ = [
    "KvEventPublisher", "VllmBlockHasher", "external_hash", "kv_events_ports",
    "sha256_cbor", "sha256_pickle",
]
