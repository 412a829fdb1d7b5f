"""Typed stub of the Rust extension (rust/py). Only bytes and ints cross the boundary."""

from typing import Any, Literal, TypedDict

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

def prefix_key(prompt: bytes, block_size: int, seed: int, blocks: int) -> int:
    """Consistent-hash key of a prompt: the chain hash (as `prefix_hashes`) of its first
    `blocks` full blocks, of all of them when it has fewer; a prompt without a full block
    hashes whole (xxh3_64_with_seed). ValueError if block_size is 0. GIL released above
    32 KiB of work."""

class BlockHashes:
    """Chain hashes of one prompt, kept in Rust (no Python int per block)."""

    def __init__(self, hashes: list[int]) -> None: ...
    def __len__(self) -> int: ...
    def tolist(self) -> list[int]: ...
    def to_bytes(self) -> bytes:
        """The hashes as little-endian u64 words (8 bytes a block): what the pod-state link
        and the shared prefix index send, without a Python int per block."""
    @staticmethod
    def from_bytes(data: bytes | memoryview) -> BlockHashes:
        """The inverse of `to_bytes`, from bytes or any contiguous byte buffer. ValueError
        unless the length is a multiple of 8."""

class BranchPoints:
    """Shared prefixes of the prompts seen: a block that two different blocks have followed
    ends a prefix several prompts continue differently (a session's growing context never
    does). At most two generations of `generation` entries; an entry looked up moves to the
    young one."""

    def __init__(self, generation: int) -> None: ...
    def observe(self, hashes: BlockHashes) -> list[int]:
        """Record the chain; return, ascending, the block counts of its prefixes whose last
        block has branched (this chain's own continuation included)."""
    def __len__(self) -> int: ...

class PrefixIndex:
    """Which endpoint (u32 id) holds which block hash; per-endpoint LRU capacity in entries.

    Inserting a chain touches its blocks last to first, so the chain head is the most
    recently used and eviction removes chain tails first. Matching does not touch the LRU.

    `hint_slots` > 0 adds an evicted-owner hint table (16 bytes a slot, rounded up to a
    power of two, direct-mapped by block hash): a block dropped for capacity (insert,
    set_capacity) keeps its last owner as a hint weighing 0.5, halved every 4 index
    capacities of that endpoint's later evictions. A match then extends an endpoint's run
    to the furthest block of the chain hinted to it, at the hints' mean weight (rounded up
    to whole blocks), listing endpoints known through hints alone too. `evict` (the
    engine's word) and `remove_endpoint` void hints.
    """

    def __init__(self, default_capacity: int, *, hint_slots: int = 0, traffic_block_bytes: int = 0) -> None:
        """`traffic_block_bytes` > 0 (the hashing block size): every insert also counts as a
        dispatch of the prompt's prefix key (its first 512 bytes), for `miss_scores`."""
    @property
    def hint_slots(self) -> int:
        """Slots of the hint table (0 without hints)."""
    def match_prompt(
        self, prompt: bytes, block_size: int, seed: int, max_blocks: int
    ) -> tuple[BlockHashes, list[tuple[int, int]]]:
        """Hash the prompt and match it: (hashes, [(endpoint, matched_blocks)]), listing only
        endpoints that hold at least the first block; order unspecified."""
    def match_hashes(self, hashes: BlockHashes) -> list[tuple[int, int]]: ...
    def insert(self, endpoint: int, hashes: BlockHashes) -> None:
        """Record that `endpoint` holds the chain (call when the request is dispatched)."""
    def miss_scores(self, ids: list[int], total: int) -> list[tuple[int, int]]:
        """prefix-cache's balanceMisses for a prompt of `total` blocks no endpoint holds:
        each of `ids` by the expected load of the prefixes dispatched there (decayed counts
        per prefix key, each key's rate shrunk toward the pooled rate), as (endpoint, blocks):
        `total` x (max - load) / max, the most loaded left out; [] without traffic on `ids`
        or without traffic counting."""
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

# --- scheduling -----------------------------------------------------------------------

class Scorer:
    """Filter and score plugins by Kthena name over endpoint signals held in Rust; one
    `schedule` call per request. Endpoint ids are u32. Not for concurrent use from several
    threads (one per worker / event loop).

    `filters`: `plugins.Filter.enabled`; `scores`: `plugins.Score.enabled` as (name,
    weight); `args`: `pluginConfig` as {name: {arg: value}} (numbers, bools or numeric
    strings; others are ignored with a warning). Plugins, their roles and arguments:
    `plugin_registry()`; `refused_plugins()` are refused. ValueError on a bad config,
    including an argument outside its spec's bounds.

    Scores are in [0, 1], combined as a weighted mean; ties are broken by a hash of
    (request_id_hash, endpoint id). Unknown is worst: an endpoint is stale until its first
    `update_metrics` and after `mark_stale`; its load is +inf and its load, latency and
    usage scores are 0 (the busiest known endpoint scores at least 0.01). A filter that
    would leave no endpoint is undone. Hot-spot guard (only with an affinity plugin:
    prefix-cache, kvcache-aware, lora-affinity): if the top endpoint's load exceeds the least
    loaded one's by more than `hot_spot_abs` requests and more than `hot_spot_rel` times,
    the list is ordered by load instead (`hot_spot_abs=inf` disables).

    Load = engine running + waiting at the last scrape + (in_flight - in_flight at that
    scrape), at least in_flight: reacts within one request without double counting.
    """

    def __init__(
        self,
        filters: list[str],
        scores: list[tuple[str, float]],
        args: dict[str, dict[str, object]] | None = None,
        *,
        hot_spot_abs: float = 64.0,
        hot_spot_rel: float = 1.5,
        max_candidates: int = 0,
    ) -> None: ...
    @property
    def warnings(self) -> list[str]:
        """Non-fatal configuration remarks (ignored or non-numeric arguments)."""
    @property
    def hot_spot_count(self) -> int:
        """Decisions in which the hot-spot guard made load win."""
    @staticmethod
    def request_hash(request_id: bytes) -> int:
        """xxh3-64 of the request id: the `request_id_hash` for `schedule`."""
    def add_endpoint(self, endpoint: int, identity: bytes | None = None) -> None:
        """Register an endpoint (stale until its first metrics). `identity`: its address
        bytes (b"ip:port"), the same in every router process; consistent hashing
        (prefix-hash-bounded) ranks endpoints by it, never by the process's id."""
    def remove_endpoint(self, endpoint: int) -> bool: ...
    def endpoints(self) -> list[int]:
        """Live endpoint ids, ascending."""
    def update_metrics(
        self, endpoint: int, running: float, waiting: float, kv_usage: float, ttft_s: float = ..., tpot_s: float = ...
    ) -> None:
        """A successful scrape (registers the endpoint, clears stale). NaN = not reported;
        NaN ttft_s/tpot_s (no sample this interval) keep the previous value."""
    def mark_stale(self, endpoint: int) -> None:
        """A failed scrape: load signals unknown (worst) until the next update_metrics."""
    def add_in_flight(self, endpoint: int, delta: int) -> int:
        """+1 at dispatch, -1 at completion; returns the new count (floored at 0)."""
    def add_lora_in_flight(self, endpoint: int, lora_id: int, delta: int) -> None:
        """A request for adapter `lora_id` dispatched to (+1) or finished on (-1) `endpoint`
        (lora-affinity's view of the adapters in the engine's batch)."""
    def add_remote_lora_in_flight(self, endpoint: int, lora_id: int, delta: int) -> None:
        """The pod's other workers' requests for adapter `lora_id` dispatched to (+) or finished
        on (-) `endpoint` (relayed by the pod-state hub; counted in lora-affinity's batch view)."""
    def retain_remote_loras(self, endpoint: int, lora_ids: list[int]) -> None:
        """Drop the relayed adapters of `endpoint` its engine no longer lists (running or
        waiting at the last scrape): a completion the relay lost must not hold a slot."""
    def clear_remote_loras(self) -> None:
        """Forget every relayed adapter count (the hub connection changed)."""
    def add_remote_in_flight(self, endpoint: int, delta: int) -> None:
        """The pod's other workers dispatched (+) / finished (-) there (relayed by the
        pod-state hub); the change since the last update_metrics is part of the load."""
    def observe_latency(self, endpoint: int, ttft_s: float = ..., tpot_s: float = ...) -> None:
        """The router's own observation, blended into the scraped means (EWMA, alpha 0.2)."""
    def add_pending(self, endpoint: int, blocks: float) -> None:
        """Prefill work dispatched to `endpoint` (+ the request's uncached prefix blocks) or
        done there (- the same, at its first token or end); prefill-cost's cost. Floored at 0."""
    def set_realization(self, endpoint: int, realization: float) -> None:
        """The share of the prefix hits the index credits `endpoint` with that its engine
        reports serving (0..1, clamped; NaN = not measured, 1); prefill-cost's realizedPrefix."""
    def set_loras(self, endpoint: int, lora_ids: list[int], max_loras: int) -> None:
        """Loaded adapters (caller-interned ids) and the engine's adapter capacity."""
    def signals(self, endpoint: int) -> dict[str, object] | None:
        """One endpoint's signals and computed load (admin views, tests)."""
    def schedule(
        self,
        request_id_hash: int,
        prefix_matches: list[tuple[int, int]] | None,
        lora_id: int | None,
        total_blocks: int,
        prefix_key: int | None = None,
    ) -> list[int]:
        """Ordered candidate endpoint ids (at most max_candidates, 0 = all).
        `prefix_key`: the request's `prefix_key(...)`, read by consistent-hash plugins
        (prefix-hash-bounded); None: the request id hash stands in.
        `prefix_matches`: [(endpoint, matched_blocks)] out of `total_blocks` (e.g.
        `PrefixIndex.match_prompt(...)[1]`, or KvOwnership's merged with it for endpoints
        whose event stream is down); both prefix-cache and kvcache-aware score the matched
        fraction. Unknown endpoint ids are ignored."""

# --- plugin registry ------------------------------------------------------------------

class ArgSpecDict(TypedDict):
    name: str  # Kthena's spelling in pluginConfig[].args
    field: str  # the Python field name (snake_case)
    kind: Literal["int", "float", "bool", "str", "map"]
    default: int | float | bool | str | dict[str, str] | None  # None = absent
    min: float | None
    max: float | None
    kthena: bool  # Kthena's argument (True) or ours
    reader: Literal["policy", "router"]  # the Rust policy, or the router around the scorer
    paths: bool  # map values are file paths

class PluginDict(TypedDict):
    name: str
    score: bool  # may be listed under plugins.Score
    filter: bool  # may be listed under plugins.Filter
    affinity: bool  # enables the hot-spot guard
    prefix_input: bool  # scores the caller's per-request prefix match
    prefix_key: bool  # reads the request's prefix key (`schedule(prefix_key=...)`)
    args: list[ArgSpecDict]

def plugin_registry() -> list[PluginDict]:
    """Every implemented scheduler plugin, in registry order: the one list the Python
    configuration loader derives plugin names and argument validation from. `Scorer`
    checks the numeric args of reader "policy" by the same specs and accepts "router"
    ones silently; other keys draw a warning."""

def refused_plugins() -> list[tuple[str, str]]:
    """Kthena plugins recognised but not implemented: (name, reason)."""

# --- KV-event ownership ---------------------------------------------------------------

def token_block_hashes(
    tokens: bytes | list[int] | Any, block_size: int, root: int, max_blocks: int, scheme: str = "xxh3",
    *, lora: str | None = None, hash_seed: str = "0",
) -> list[int]:
    """Chain hashes (64-bit event form) of the first min(len // block_size, max_blocks) full
    token blocks. `tokens`: ints, a native u32 buffer (`array('I')`) or little-endian u32
    bytes. Schemes (published algorithms only):
    "vllm-sha256-cbor" = vLLM's hash_block_tokens with sha256 over canonical CBOR of
    (parent digest or NONE_HASH, tuple(tokens), (lora,) or None), NONE_HASH =
    sha256(cbor(hash_seed)) (the engines' PYTHONHASHSEED); the hash is the digest's last 8
    bytes big-endian (reference: kthena_router/kv_events/hashing.py); `root` is unused.
    "xxh3" = xxh3_64(le64(parent) || le32 tokens..., seed 0) chained from `root`; `lora`
    is unused (fold it into root). ValueError for block_size 0 or an unknown scheme. GIL
    released above 8k tokens."""

def block_hash_key(block_hash: bytes) -> int:
    """Table key of a block hash sent as bytes (vLLM's default 32-byte digest): the last
    8 bytes big-endian, equal to vLLM's int form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""

class KvOwnership:
    """Which endpoint's engine holds which block hash (u64 keys), fed by KV events
    (BlockStored / BlockRemoved / AllBlocksCleared). Hashes are reference counted per
    endpoint (vLLM may hold two blocks with one hash, and DP ranks report separately): a
    hash stays owned until removed as often as stored. Memory is bounded by a per-endpoint
    capacity (set it to the engine's KV block count); exceeding it means removals were
    missed: the oldest stored entries are dropped and counted in `overflow_drops`.

    An endpoint whose event stream is down is skipped by matches and listed by
    `down_endpoints()`, so the caller falls back to PrefixIndex for it.
    """

    def __init__(self, default_capacity: int, hash_scheme: str = "xxh3", hash_seed: str = "0", *,
                 hash_memo_blocks: int = 0) -> None:
        """`hash_scheme`/`hash_seed`: as token_block_hashes (for match_tokens).
        `hash_memo_blocks`: digests of up to this many recently hashed blocks are remembered
        (vllm-sha256-cbor only; ~50-100 bytes each), keyed by what the block's digest is
        computed over (parent digest, tokens, LoRA), so match_tokens does not hash a prefix
        shared with an earlier prompt again; 0: no memo."""
    def apply(self, endpoint: int, batch: bytes) -> int:
        """Apply a batch in the flat encoding: little-endian u64 words `tag, n, hash * n`
        per event; tag 1 BlockStored (chain order), 2 BlockRemoved, 3 AllBlocksCleared
        (n = 0). Validated first: a malformed batch raises ValueError and changes nothing.
        Returns the event count. GIL released above 64 KiB."""
    def stored(self, endpoint: int, block_hashes: list[int]) -> None:
        """BlockStored (ints in [0, 2**64); mask negative ones with & (2**64 - 1))."""
    def removed(self, endpoint: int, block_hashes: list[int]) -> None: ...
    def all_cleared(self, endpoint: int) -> int:
        """AllBlocksCleared; the endpoint stays registered. Returns the entries removed."""
    def match_hashes(self, block_hashes: list[int]) -> list[tuple[int, int]]:
        """[(endpoint, matched leading blocks)] for stream-up endpoints matching >= 1 block;
        order unspecified."""
    def match_tokens(
        self, tokens: bytes | list[int] | Any, block_size: int, root: int = 0, max_blocks: int = ...,
        lora: str | None = None,
    ) -> tuple[int, list[tuple[int, int]]]:
        """Hash the tokens with the table's scheme (blocks hashed before from the digest
        memo) and match, in one call: (blocks hashed, [(endpoint, matched leading blocks)]
        over stream-up endpoints). Above 8k tokens the hashing runs without the GIL (and
        without holding the table)."""
    def hash_memo_stats(self) -> tuple[int, int, int, int]:
        """(entries, capacity, hits, misses) of the digest memo; hits/misses count blocks."""
    def clear_hash_memo(self) -> None: ...
    def remove_endpoint(self, endpoint: int) -> int:
        """Purge an endpoint that disappeared; returns the entries removed."""
    def set_stream_down(self, endpoint: int, down: bool, clear: bool = True) -> None:
        """Mark the event stream down (clearing the entries, which a gap makes
        untrustworthy, unless clear=False) or up again."""
    def is_stream_down(self, endpoint: int) -> bool: ...
    def down_endpoints(self) -> list[int]:
        """Endpoints whose stream is down, sorted."""
    def set_capacity(self, endpoint: int, capacity: int) -> None: ...
    def endpoint_len(self, endpoint: int) -> int: ...
    def endpoints(self) -> list[int]: ...
    def endpoint_hashes(self, endpoint: int) -> list[int]:
        """Hashes held, newest stored first (compare with the engine's cache content)."""
    def refs(self, endpoint: int, block_hash: int) -> int: ...
    @property
    def overflow_drops(self) -> int: ...
    @property
    def unknown_removals(self) -> int:
        """BlockRemoved for hashes not held: a desync signal."""
    def memory_bytes(self) -> int: ...
    def __len__(self) -> int: ...

class FairQueue:
    """The fair queue of one model (rust/core/src/fairq.rs): priority levels first (classes
    by ascending `order`; equal orders share a level), then within a level the tenant with
    the smallest virtual token counter (VTC, OSDI 2024), FIFO per tenant. Tenants are ints
    interned by the caller; class ids are indices of `classes` [(order, weight, max_len)].
    Cost of a request to its tenant: (token_weight * (input_weight * in + output_weight *
    out) + request_weight) * class weight / tenant weight; the input estimate and request
    cost at dispatch (`dequeue`/`admit`), the rest at `settle`. A tenant that becomes
    backlogged is lifted to the smallest backlogged counter (none: the last one to leave).
    ValueError on a bad class list, weight or class id. Not for concurrent use from threads.
    """

    def __init__(
        self,
        classes: list[tuple[int, float, int]],
        input_weight: float = 1.0,
        output_weight: float = 2.0,
        token_weight: float = 1.0,
        request_weight: float = 0.0,
    ) -> None: ...
    def __len__(self) -> int: ...
    def class_len(self, class_id: int) -> int: ...
    def set_max_len(self, class_id: int, max_len: int) -> None: ...
    def enqueue(self, class_id: int, tenant: int, weight: float, input_est: int, now_ms: int) -> int:
        """Ticket (> 0), or 0 when the class is at its max length."""
    def dequeue(self, now_ms: int) -> int:
        """The next ticket (charged its dispatch cost), 0 when nothing waits."""
    def admit(self, class_id: int, tenant: int, weight: float, input_est: int, now_ms: int) -> None:
        """A request that goes through without waiting: lifted, charged its dispatch cost."""
    def cancel(self, ticket: int) -> bool:
        """Remove a waiter at once; False if it is not waiting."""
    def settle(self, class_id: int, tenant: int, input_delta: int, output: int, now_ms: int) -> None:
        """A dispatched request ended: real prompt tokens - estimate, and output tokens."""
    def counter(self, class_id: int, tenant: int) -> float | None: ...
    def prune(self, now_ms: int, idle_ms: int) -> list[int]:
        """Forget tenants idle that long with nothing waiting or in flight; the ids freed."""
    def tenants(self) -> int: ...
    def waiting(self) -> list[tuple[int, int, int]]:
        """(ticket, class_id, tenant) of every waiter, in arrival order."""

def render_prompt(body: bytes, chat: bool) -> bytes | None:
    """scheduling/render.py's render_request(orjson.loads(body), chat) for common shapes; None: Python must render."""

class Rotation:
    """One round-robin position shared by Python's RoundRobinBalancer and the Rust front."""
    def __init__(self) -> None: ...
    def start(self, n: int) -> int:
        """The first of n endpoints for this request; advances only when n > 1."""

class Front:
    """One worker's Rust front end (`--interface rust`, auto's usual choice, rust/py/src/front/,
    docs/rust-front.md): an HTTP/1.1 server on host:port (SO_REUSEPORT, TCP_NODELAY) on its own
    tokio runtime (`threads`). Chat/text completions queue a decision for Python; everything
    else, and every request Python sends down the slow path, goes unchanged to granian's
    unix socket `uds`. Python reads `wake_fd` (readable when events are queued) and calls
    `drain()`; the decision methods are thread-safe and return False when the client left."""

    def __init__(self, host: str, port: int, uds: str, threads: int = 1, max_body: int = 33554432,
                 pool_size: int = 512) -> None: ...
    @property
    def wake_fd(self) -> int:
        """The loop's end of the wake-up socket pair (the caller owns and closes it)."""
    def drain(self) -> list[tuple[Any, ...]]:
        """Queued events, oldest first: (0, id, path, query: bytes, headers: [(name, value)], body: bytes)
        asks for a decision; (1, id, status, error, attempts: [(index, failure)], duration_s, ttft_s,
        attempt_ttft_s, tpot_s, prompt_tokens, completion_tokens, events) reports a finished fast-path
        request (floats < 0 and ints < 0: unknown; codes in rust/py/src/front/fast.rs); (2, id, attempts)
        when a stream's first event reached the client (the last attempt answers); (3, id, endpoint
        index, events) every second of a running stream: its events since the last such report;
        (4, id, version, model, target, order: [endpoint index], stream, chat, request_id, age_s, sched)
        for a request the front decided itself from the installed table (before its other events;
        sched: None or (hashes, prompt bytes, match s, schedule s, best share, pending blocks)); (5, id)
        when a stream's first event reached the front and its `fast` call asked for it."""
    def fast(self, id: int, addrs: list[str], hosts: list[str], target: str, headers: bytes, body: bytes,
             stream: bool, hide_usage: bool, timeouts: tuple[float, float, float, float, float, float, float],
             max_buffered: int, request_id: str, first_token_event: bool = False) -> bool:
        """Relay request `id` in Rust: attempt i goes to addrs[i] ("ip:port", Host hosts[i]) while no
        byte reached the client; `headers` are CRLF-terminated lines; timeouts (connect, response,
        firstToken, idle, total, poolWait, retryInterval) in seconds, < 0 = none;
        `first_token_event`: report the stream's first event (drain's kind 5)."""
    def install(self, version: int, models: list[tuple[str, list[tuple[int, int]], int, bytes | None, list[int]]],
                servers: list[tuple[list[str], list[str], int, int, bytes,
                                    tuple[float, float, float, float, float, float, float], int,
                                    tuple[Scorer, list[int]] | None, Rotation | None]],
                prefix: tuple[PrefixIndex, int, int, bool, bool] | None = None) -> None:
        """The table of models the front decides alone (kthena_router/front/table.py): per model
        (name, [(cumulative weight, server index)], total weight, the JSON upstream model name or
        None, the prefix seed per target), per server (addrs, hosts, retry attempts (< 0: default),
        default retry endpoints, extra header lines, timeouts as in `fast`, max buffered bytes,
        None or the scheduler's (Scorer, endpoint id per endpoint), the round-robin position
        Python's balancer shares or None); `prefix`: the scheduler's
        index and (block size, max blocks, balance misses, prefill-cost's pending work) when a
        prefix plugin scores. Servers start not calm."""
    def calm(self, version: int, flags: list[bool]) -> None:
        """Which servers of table `version` the front may decide for (every endpoint usable)."""
    def uninstall(self) -> None:
        """No table: every completion asks Python."""
    def admission(self, limit: int, others: int) -> None:
        """The worker's admission limit (0: none) and its requests in flight off the fast path."""
    def live(self) -> int:
        """Fast-path requests running now."""
    def slow(self, id: int) -> bool:
        """Forward request `id` unchanged to the full app."""
    def reply(self, id: int, status: int, body: bytes, headers: list[tuple[str, str]] = ...) -> bool:
        """Answer request `id` at once with this JSON body."""
    def waiting(self) -> int:
        """Requests waiting for a decision."""
    def stop_accepting(self) -> None: ...
    def close(self) -> None:
        """Stop the runtime (its in-flight requests end) and join its thread."""
