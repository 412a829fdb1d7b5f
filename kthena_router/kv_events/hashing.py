"""vLLM's prefix-cache block hashes, computed by the router from token ids.

Router-side implementation, independent of the simulator's (the engines' hashes must
agree with these only because both follow vLLM). Facts, from vLLM's source:

- vllm/v1/core/kv_cache_utils.py `hash_block_tokens`: a block's digest is
  `hash_fn((parent_digest or NONE_HASH, tuple(block_token_ids), extra_keys))`, over full
  blocks only, chained with the parent's *full* digest. `extra_keys` is `(lora_name,)`
  for LoRA requests, None otherwise (multimodal and cache_salt keys are not supported here).
- `init_none_hash`: `NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))`, the seed as a
  string; random when unset, so engines must run with a fixed PYTHONHASHSEED and the
  router must be given the same value (`hash_seed`).
- vllm/utils/hashing.py: `sha256_cbor(x) = sha256(cbor2.dumps(x, canonical=True))`
  (reproducible across languages); `sha256(x) = sha256(pickle.dumps(x, HIGHEST_PROTOCOL))`
  (vLLM's default `--prefix-caching-hash-algo`); xxhash/xxhash_cbor (xxh3_128) are not
  supported here.
- `maybe_convert_block_hash` (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default): the
  hash in KV events is `int.from_bytes(digest, "big") & (2**64 - 1)`. With the variable
  set to 0, events carry the raw digest bytes; `fold_hash` maps both to the same int.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any, Literal

HashAlgo = Literal["sha256_cbor", "sha256"]
MASK64 = 0xFFFF_FFFF_FFFF_FFFF

_PACK_B = struct.Struct(">B").pack
_PACK_H = struct.Struct(">H").pack
_PACK_I = struct.Struct(">I").pack
_PACK_Q = struct.Struct(">Q").pack


def _head(major: int, n: int) -> bytes:
    """Canonical (shortest) CBOR item head."""
    ib = major << 5
    if n <= 23:
        return _PACK_B(ib | n)
    if n <= 0xFF:
        return _PACK_B(ib | 24) + _PACK_B(n)
    if n <= 0xFFFF:
        return _PACK_B(ib | 25) + _PACK_H(n)
    if n <= 0xFFFF_FFFF:
        return _PACK_B(ib | 26) + _PACK_I(n)
    if n <= MASK64:
        return _PACK_B(ib | 27) + _PACK_Q(n)
    raise ValueError("integer out of CBOR's 64-bit range")


def _int(v: int) -> bytes:
    return _head(0, v) if v >= 0 else _head(1, ~v)  # ~v == -1 - v


def _cbor_key(parent: bytes, tokens: Sequence[int], extra: tuple[str, ...] | None) -> bytes:
    """CBOR of the 3-tuple (parent, tokens, extra_keys), specialised for block keys."""
    parts = [b"\x83", _head(2, len(parent)), parent, _head(4, len(tokens))]
    parts.extend(map(_int, tokens))
    if extra is None:
        parts.append(b"\xf6")
    else:
        parts.append(_head(4, len(extra)))
        for s in extra:
            b = s.encode("utf-8")
            parts.append(_head(3, len(b)))
            parts.append(b)
    return b"".join(parts)


def _cbor_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return _head(3, len(b)) + b


def fold_hash(h: int | bytes) -> int:
    """A block hash as found in an event (int or digest bytes) -> the 64-bit int form."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(h)[-8:], "big")
    return h & MASK64


class BlockHasher:
    """Hashes token ids into vLLM block hashes (64-bit event form)."""

    def __init__(self, block_size: int = 16, algo: HashAlgo = "sha256_cbor",
                 hash_seed: str = "0") -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.algo = algo
        self.hash_seed = hash_seed
        self._digest: Callable[[bytes, Sequence[int], tuple[str, ...] | None], bytes]
        if algo == "sha256_cbor":
            self.none_hash = hashlib.sha256(_cbor_str(hash_seed)).digest()
            self._digest = lambda p, t, e: hashlib.sha256(_cbor_key(p, t, e)).digest()
        elif algo == "sha256":
            dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
            self.none_hash = hashlib.sha256(dumps(hash_seed, protocol=proto)).digest()
            self._digest = lambda p, t, e: hashlib.sha256(dumps((p, tuple(t), e), protocol=proto)).digest()
        else:
            raise ValueError(f"unsupported prefix-caching hash algo {algo!r}")

    def digests(self, token_ids: Sequence[int], lora_name: str | None = None,
                max_blocks: int | None = None, parent: bytes | None = None) -> list[bytes]:
        """Full digests of the full blocks of `token_ids` (continuing from `parent`)."""
        bs = self.block_size
        n = len(token_ids) // bs
        if max_blocks is not None:
            n = min(n, max_blocks)
        extra = (lora_name,) if lora_name is not None else None
        prev = parent or self.none_hash
        digest = self._digest
        out: list[bytes] = []
        for i in range(n):
            prev = digest(prev, token_ids[i * bs:(i + 1) * bs], extra)
            out.append(prev)
        return out

    def hashes(self, token_ids: Sequence[int], lora_name: str | None = None,
               max_blocks: int | None = None) -> list[int]:
        """64-bit block hashes as engines publish them, in prompt order."""
        return [int.from_bytes(d[-8:], "big") for d in self.digests(token_ids, lora_name, max_blocks)]


def describe(h: BlockHasher) -> dict[str, Any]:
    return {"algo": h.algo, "hash_seed": h.hash_seed, "block_size": h.block_size}
