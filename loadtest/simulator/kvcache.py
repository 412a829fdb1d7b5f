"""Paged KV cache with block-level prefix caching (vLLM V1 semantics).

Blocks hold `block_size` tokens. A *full* block of a sequence is identified by a hash
chain: hash(parent block hash, the block's token ids), rooted in a per-LoRA value, so
equal prefixes under the same adapter share blocks. Blocks have a reference count;
when it drops to 0 a block goes to a free list:
- blocks that carry a hash go to an LRU queue and stay findable by that hash (a later
  hit takes them back); a fresh allocation evicts the least recently freed one first,
  which removes its hash (BlockRemoved);
- blocks that carry no hash (partial blocks, caching off) go to a plain stack and are
  reused before any cached block is evicted.
Callers free a sequence's blocks tail-first (as vLLM does), so a sequence's last
blocks are evicted before its shared prefix.

Observability for KV events and admin views: listeners get `blocks_stored`,
`blocks_removed` and `all_blocks_cleared` calls (vLLM's BlockStored / BlockRemoved /
AllBlocksCleared), and `cached_block_hashes()` lists the whole cache content.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Protocol

MASK64 = (1 << 64) - 1
_BASE_ROOT = 0x6B7468656E61  # "kthena": root of the chain for the base model


def root_hash(lora: str | None) -> int:
    """Parent hash of a sequence's first block: separates caches per LoRA adapter."""
    if lora is None:
        return _BASE_ROOT
    return (zlib.crc32(lora.encode()) << 32 | zlib.adler32(lora.encode())) & MASK64


def hash_block(parent: int, tokens: tuple[int, ...]) -> int:
    # Python's tuple/int hashing is not randomized per process, so values are stable.
    return hash((parent, tokens)) & MASK64


class KVCacheListener(Protocol):
    def blocks_stored(
        self,
        block_hashes: list[int],
        parent_block_hash: int | None,
        token_ids: list[int],
        block_size: int,
        lora: str | None,
    ) -> None: ...

    def blocks_removed(self, block_hashes: list[int]) -> None: ...

    def all_blocks_cleared(self) -> None: ...


class KVCache:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() -> 0 first
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._listeners: list[KVCacheListener] = []
        self.evictions_total = 0

    # --- observation ----------------------------------------------------------------
    def add_listener(self, listener: KVCacheListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: KVCacheListener) -> None:
        self._listeners.remove(listener)

    def cached_block_hashes(self) -> list[int]:
        """Every block hash the cache holds (in use or free-but-cached)."""
        return list(self._by_hash)

    def eviction_order(self) -> list[int]:
        """Hashes of free cached blocks, next to be evicted first."""
        h = self._hash
        return [h[b] for b in self._free_cached]  # type: ignore[misc]

    @property
    def num_free(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    @property
    def num_cached_free(self) -> int:
        return len(self._free_cached)

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    # --- prefix lookup --------------------------------------------------------------
    def lookup(self, block_hashes: list[int]) -> list[int]:
        """Block ids of the longest cached prefix of `block_hashes` (no side effects)."""
        found: list[int] = []
        get = self._by_hash.get
        for h in block_hashes:
            b = get(h)
            if b is None:
                break
            found.append(b)
        return found

    def num_free_among(self, block_ids: list[int]) -> int:
        ref = self._ref
        return sum(1 for b in block_ids if ref[b] == 0)

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference on cached blocks found by lookup()."""
        ref, fc = self._ref, self._free_cached
        for b in block_ids:
            if ref[b] == 0:
                del fc[b]
            ref[b] += 1

    # --- allocation -----------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """n fresh blocks; the caller checked n <= num_free. Evicts LRU cached blocks."""
        if n > self.num_free:
            raise RuntimeError(f"allocate({n}) with only {self.num_free} free blocks")
        out: list[int] = []
        plain, ref = self._free_plain, self._ref
        while plain and len(out) < n:
            b = plain.pop()
            ref[b] = 1
            out.append(b)
        if len(out) < n:
            removed: list[int] = []
            fc, hashes, by_hash = self._free_cached, self._hash, self._by_hash
            while len(out) < n:
                b, _ = fc.popitem(last=False)
                h = hashes[b]
                hashes[b] = None
                del by_hash[h]  # type: ignore[arg-type]
                removed.append(h)  # type: ignore[arg-type]
                ref[b] = 1
                out.append(b)
            self.evictions_total += len(removed)
            for listener in self._listeners:
                listener.blocks_removed(removed)
        return out

    def cache_blocks(
        self,
        block_ids: list[int],
        block_hashes: list[int],
        parent_hash: int | None,
        token_ids: list[int],
        lora: str | None,
    ) -> None:
        """Register newly full blocks (consecutive in one sequence) under their hashes.

        `token_ids` holds the tokens of all `block_ids`, block after block; `parent_hash`
        is the hash of the block before the first one (None for a sequence's first).

        A hash already present (the same content computed by another sequence at the
        same time) keeps its first block; the duplicate stays unhashed, as in vLLM.
        """
        hashes, by_hash = self._hash, self._by_hash
        runs: list[tuple[int, int]] = []  # [start, end) index ranges actually stored
        start = -1
        for i, (b, h) in enumerate(zip(block_ids, block_hashes)):
            if h in by_hash or hashes[b] is not None:
                if start >= 0:
                    runs.append((start, i))
                    start = -1
                continue
            hashes[b] = h
            by_hash[h] = b
            if start < 0:
                start = i
        if start >= 0:
            runs.append((start, len(block_ids)))
        if runs and self._listeners:
            bs = self.block_size
            for s, e in runs:
                parent = block_hashes[s - 1] if s > 0 else parent_hash
                toks = token_ids[s * bs : e * bs]
                for listener in self._listeners:
                    listener.blocks_stored(block_hashes[s:e], parent, toks, bs, lora)

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference on each block; pass them in sequence order (freed tail-first)."""
        ref, hashes, plain, fc = self._ref, self._hash, self._free_plain, self._free_cached
        for b in reversed(block_ids):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if hashes[b] is None:
                    plain.append(b)
                else:
                    fc[b] = None
            elif r < 0:
                raise RuntimeError(f"block {b} freed twice")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use, like vLLM."""
        if self.num_used:
            return False
        for b in self._free_cached:
            self._hash[b] = None
            self._free_plain.append(b)
        self._free_cached.clear()
        self._by_hash.clear()
        for listener in self._listeners:
            listener.all_blocks_cleared()
        return True
