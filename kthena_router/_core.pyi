"""Typed stub of the Rust extension (rust/py). Only bytes and ints cross the boundary."""

__version__: str

def splice_top_level(body: bytes, replacements: list[tuple[bytes, bytes]]) -> bytes:
    """Rewrite top-level members of the JSON object `body` without re-encoding it.

    For each (key, raw_json_value): every top-level member whose key equals `key` (raw bytes
    between the quotes) gets `raw_json_value` as its value (all duplicates); an absent key is
    appended as `,"key":value` before the final `}`. Nested values and all other bytes are
    copied verbatim. The last duplicate in `replacements` wins. An escaped key spelling in
    the body (e.g. "mod\\u0065l") is not matched: the key is then appended, and being last it
    wins for last-wins parsers (orjson, json, pydantic), so callers need no extra check.
    `key` must not contain '"', '\\' or control bytes. Raises ValueError on invalid JSON.
    The GIL is released for bodies over 64 KiB.
    """

def prefix_seed(model: bytes, lora: bytes) -> int:
    """Seed of the prefix hash chain for a (model, LoRA adapter) pair; `lora` is b"" for the
    base model. Different pairs never match each other's blocks."""

def prefix_hashes(prompt: bytes, block_size: int, seed: int, max_blocks: int) -> BlockHashes:
    """Chain hashes of the first min(len(prompt) // block_size, max_blocks) full blocks:
    h_i = xxh3_64_with_seed(le64(h_{i-1}) || block_i, seed), h_{-1} = seed. A trailing
    partial block is not hashed. ValueError if block_size is 0. GIL released above 32 KiB."""

class BlockHashes:
    """Chain hashes of one prompt, kept in Rust (no Python int per block)."""

    def __init__(self, hashes: list[int]) -> None: ...
    def __len__(self) -> int: ...
    def tolist(self) -> list[int]: ...

class PrefixIndex:
    """Which endpoint (u32 id) holds which block hash; per-endpoint LRU capacity in entries.

    Inserting a chain touches its blocks last to first, so the chain head is the most
    recently used and eviction removes chain tails first. Matching does not touch the LRU.
    """

    def __init__(self, default_capacity: int) -> None: ...
    def match_prompt(
        self, prompt: bytes, block_size: int, seed: int, max_blocks: int
    ) -> tuple[BlockHashes, list[tuple[int, int]]]:
        """Hash the prompt and match it: (hashes, [(endpoint, matched_blocks)]), listing only
        endpoints that hold at least the first block; order unspecified."""
    def match_hashes(self, hashes: BlockHashes) -> list[tuple[int, int]]: ...
    def insert(self, endpoint: int, hashes: BlockHashes) -> None:
        """Record that `endpoint` holds the chain (call when the request is dispatched)."""
    def evict(self, endpoint: int, hashes: BlockHashes) -> int:
        """Forget these hashes for `endpoint`; returns how many it held."""
    def remove_endpoint(self, endpoint: int) -> int:
        """Purge an endpoint that disappeared; returns the entries removed."""
    def set_capacity(self, endpoint: int, capacity: int) -> None:
        """Set the endpoint's capacity (entries), evicting its LRU entries above it."""
    def endpoint_len(self, endpoint: int) -> int: ...
    def endpoints(self) -> list[int]:
        """Known endpoint ids, sorted."""
    def memory_bytes(self) -> int:
        """Bytes allocated by the index's own structures."""
    def __len__(self) -> int: ...
