"""`kvcache-aware`: exact prefix matching against the engines' KV-cache events.

Per worker: a `KvEventSubscribers` (one ZMQ subscription per endpoint, kv_events/) feeds a
Rust `KvOwnership` table through `_Sink`; per request (`match`, called by the Scheduler):
render the chat template, tokenize locally (cached per prompt prefix: only new text is
tokenized), then ONE Rust call hashes the tokens with vLLM's sha256_cbor scheme (blocks
hashed before come from the table's digest memo) and matches them against the table.

Event source of an endpoint (file mode: Endpoints labels; Kubernetes: the pod's labels):
`tcp://<endpoint ip>:<kthena.io/kv-events-port>` with replay on
`<kthena.io/kv-events-replay-port>` ("0" or "none": no replay socket); without labels the
plugin's kvEventsPort / kvEventsReplayPort (vLLM's 5557 / 5558).

Fallback (metric `kthena_router_kvcache_aware_fallback_total{model,reason}`, counted here):
endpoints whose stream is not up, or that have none, get the approximate prefix-cache
match, rescaled to token blocks (reason `stream_down` when a subscribed stream is not up); a request without a usable tokenizer or template
uses prefix-cache alone (`no_tokenizer`, `tokenize_error`).

Shared prefixes (kvEvents.sharedPrefixMemory; on for automatic matching, off for the listed
plugin unless set): a Rust `BranchPoints` table learns which of the approximate index's
blocks two different blocks have followed (a group's system prompt, a shared document).
On an up endpoint the match is then the larger of the exact one and the approximate run
cut back to its last such block: a shared prefix the engine evicted still draws its
group back there (one re-prefill, the group not scattered), while a private context (a
session's, which never branches) is matched exactly and placed by load once evicted.

Prompts of OFFLOAD_CHARS or more are tokenized on a thread before scheduling (prepare()),
so a cold 100k-token prompt (~0.45 s) does not stall the worker's event loop; shorter ones
inline (the prefix cache makes repeats cheap). Known limits: one event stream per endpoint (no DP
ranks on separate ports); vLLM's default pickle-based hash is not reproduced.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kthena_router._core import BlockHashes, BranchPoints, KvOwnership, PrefixIndex
from kthena_router.kv_events import EventSource, KvEventSubscribers, StreamState, StreamStatus
from kthena_router.metrics import RouterMetrics

from .chat_template import ChatTemplate, load_chat_template
from .config import KvCacheAwareArgs, SchedulerSettings
from .exact_auto import KvEventsSettings, auto_exact_args
from .request import CHAT_PATH, PROMPT_PATHS, RequestInfo
from .tokenizer_cache import CachedTokenizer, TokenizerRegistry, TokenizerUnavailable, engine_adds_special_tokens

__all__ = ["KvAwareMatcher", "LABEL_PORT", "LABEL_REPLAY_PORT", "event_source", "event_sources", "matcher_for"]

log = logging.getLogger(__name__)

# Prompts at least this long (characters) are tokenized on a thread: ~2k tokens, ~5 ms cold.
OFFLOAD_CHARS = 8192

LABEL_PORT = "kthena.io/kv-events-port"
LABEL_REPLAY_PORT = "kthena.io/kv-events-replay-port"
SCHEME = "vllm-sha256-cbor"
# Entries per endpoint before the table drops the oldest (only reached if removals are
# missed; memory is per entry, not per capacity).
DEFAULT_CAPACITY = 1 << 21
# In-flight blindness: a prompt dispatched to an endpoint whose stream is up reaches that
# engine's events only once the engine has prefilled it (its queue wait, then the prefill;
# seconds under load). Until then the exact match does not see it, and a burst of one
# prefix would spread over the engines, each looking empty. So dispatches to up endpoints
# are remembered (approximate byte blocks, as the prefix index hashes them) for RECENT_S to
# 2 x RECENT_S seconds (two generations) and an up endpoint's match is the larger of its
# exact match and that recent one. Measured on a mixed fleet: docs/kv-exact-default.md.
# Off (0) by default: at 4 s it narrowed the mixed fleet's hit-rate gap to `off` but did
# not close it, and kvcache-aware's mean TTFT against round-robin got worse in its
# integration test (ratio 0.56-0.90 with it, 0.50-0.75 without, idle machine).
RECENT_S = 0.0
RECENT_CAPACITY = 1 << 16  # entries per endpoint and generation
# Block hashes per generation of the shared-prefix table (two generations are kept): a
# memory bound (~10 MB a generation), about a thousand long conversations' worth of blocks.
BRANCH_GENERATION = 1 << 18


def hash_memo_blocks(args: KvCacheAwareArgs) -> int:
    """Blocks whose digests the table remembers: as many tokens as the tokenizer caches
    hold (one cache per tokenizer file), so a prefix whose tokens are cached is not hashed
    again either. ~50-100 bytes per block."""
    files = max(1, len(set(args.tokenizers.values())))
    return files * args.tokenizer_cache_tokens // args.block_size_to_hash


def event_source(ip: str, labels: Mapping[str, str], args: KvCacheAwareArgs,
                 labelled_only: bool = False) -> EventSource | None:
    """The endpoint's publisher address from its labels, else the plugin defaults; None if
    the labels are unusable, or absent with `labelled_only` (automatic exact matching
    follows only endpoints that advertise a stream)."""
    if labelled_only and LABEL_PORT not in labels:
        return None
    try:
        port = int(labels.get(LABEL_PORT, args.kv_events_port))
        rp = labels.get(LABEL_REPLAY_PORT, str(args.kv_events_replay_port))
        replay = None if rp.lower() in ("0", "none", "") else int(rp)
    except ValueError:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return EventSource(f"tcp://{host}:{port}", None if replay is None else f"tcp://{host}:{replay}")


def event_sources(endpoints: Iterable[tuple[str, str, Mapping[str, str]]], endpoint_id: Callable[[str], int | None],
                  args: KvCacheAwareArgs, labelled_only: bool = False) -> dict[str, tuple[int, EventSource]]:
    """KvAwareMatcher.set_endpoints' argument from (endpoint key, ip, labels) triples: each
    endpoint the scheduler knows (`endpoint_id`) with a usable source, first occurrence wins."""
    out: dict[str, tuple[int, EventSource]] = {}
    for key, ip, labels in endpoints:
        if key in out:
            continue
        ep_id = endpoint_id(key)
        src = event_source(ip, labels, args, labelled_only) if ep_id is not None else None
        if src is not None:
            out[key] = (ep_id, src)  # type: ignore[assignment]  # ep_id checked above
    return out


class _Sink:
    """kv_events.OwnershipSink over the Rust table: endpoint keys ("ip:port") -> ids."""

    def __init__(self, matcher: KvAwareMatcher) -> None:
        self._m = matcher

    def stored(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        i = self._m.ids.get(endpoint_id)
        if i is not None:
            self._m.table.stored(i, list(hashes))

    def removed(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        i = self._m.ids.get(endpoint_id)
        if i is not None:
            self._m.table.removed(i, list(hashes))

    def cleared(self, endpoint_id: str) -> None:
        i = self._m.ids.get(endpoint_id)
        if i is not None:
            self._m.table.all_cleared(i)

    def set_stream_up(self, endpoint_id: str, up: bool) -> None:
        self._m.stream_changed(endpoint_id, up)


class KvAwareMatcher:
    """The Scheduler's `kv_matcher` (matcher_hook.KvAwareMatcher protocol)."""

    def __init__(self, args: KvCacheAwareArgs, metrics: RouterMetrics, *,
                 subscriber_options: Mapping[str, Any] | None = None, auto: bool = False) -> None:
        self.args = args
        # auto: runs under prefix-cache (scheduling/exact_auto.py), for labelled endpoints only
        self.auto = auto
        self.metrics = metrics
        self.table = KvOwnership(DEFAULT_CAPACITY, SCHEME, args.hash_seed,
                                 hash_memo_blocks=hash_memo_blocks(args))
        self.tokenizers = TokenizerRegistry.from_args(args)
        self._templates: dict[str, ChatTemplate | None] = {}
        self.ids: dict[str, int] = {}  # endpoint key -> scheduler endpoint id
        self._keys: dict[int, str] = {}
        self._up: set[int] = set()
        self._down_ids: frozenset[int] = frozenset()  # subscribed, stream not up
        self.sourced: frozenset[int] = frozenset()  # ids with an event source (subscribed)
        self.generation = 0  # bumped when `sourced` changes (the scheduler caches per view)
        self.subscribers = KvEventSubscribers(_Sink(self), on_status=self._on_status,
                                              options=dict(subscriber_options or {}))
        self.recent_s = RECENT_S  # 0: no recent-dispatch overlay (exact matches only)
        self._recent = (PrefixIndex(RECENT_CAPACITY), PrefixIndex(RECENT_CAPACITY))
        self._recent_used = False  # an entry may be in either generation
        self._rotated = time.monotonic()
        # shared prefixes keep the approximate index's memory on up endpoints (matcher_for)
        self.branches: BranchPoints | None = None

    # --- endpoints and streams (event loop, rare) ------------------------------------------
    def set_endpoints(self, endpoints: Mapping[str, tuple[int, EventSource]]) -> None:
        """{endpoint key: (scheduler id, event source)} of every live endpoint."""
        for key in [k for k in self.ids if k not in endpoints]:
            i = self.ids.pop(key)
            self._keys.pop(i, None)
            self._up.discard(i)
            self.table.remove_endpoint(i)
        for key, (i, _) in endpoints.items():
            if key not in self.ids:
                self.ids[key] = i
                self._keys[i] = key
                self.table.set_stream_down(i, True)  # until its stream is up
        self._refresh_down()
        sourced = frozenset(self.ids.values())
        if sourced != self.sourced:
            self.sourced = sourced
            self.generation += 1
        self.subscribers.set_sources({k: src for k, (_, src) in endpoints.items()})

    def dispatched(self, ep_id: int, hashes: BlockHashes) -> None:
        """Scheduler.dispatched: the prompt (approximate hashes) went to `ep_id` now."""
        if ep_id in self._up and self.recent_s > 0:
            self._rotate()
            self._recent[0].insert(ep_id, hashes)
            self._recent_used = True

    def _rotate(self) -> None:
        now = time.monotonic()
        age = now - self._rotated
        if age < self.recent_s:
            return
        young = PrefixIndex(RECENT_CAPACITY)
        # two periods idle: both generations are too old
        self._recent = (young, self._recent[0] if age < 2 * self.recent_s else PrefixIndex(RECENT_CAPACITY))
        self._rotated = now

    def _recent_matches(self, hashes: BlockHashes) -> dict[int, int]:
        """Up endpoints -> byte blocks of this prompt dispatched to them recently."""
        self._rotate()
        out: dict[int, int] = {}
        for gen in self._recent:
            for e, m in gen.match_hashes(hashes):
                if m > out.get(e, 0):
                    out[e] = m
        return out

    def stream_changed(self, key: str, up: bool) -> None:
        i = self.ids.get(key)
        if i is None:
            return
        # down: forget its blocks (a gap makes them untrustworthy; a reconnect replays)
        self.table.set_stream_down(i, not up, clear=not up)
        if up:
            self._up.add(i)
        else:
            self._up.discard(i)
        self._refresh_down()

    def streams_not_up(self) -> set[str]:
        """Endpoint keys whose event stream is not up (connecting, syncing or down)."""
        return {self._keys[i] for i in self._down_ids}

    def _refresh_down(self) -> None:
        self._down_ids = frozenset(i for i in self._keys if i not in self._up)

    def _on_status(self, st: StreamStatus) -> None:
        self.metrics.set_kv_stream_up(st.endpoint_id, st.state is StreamState.UP)

    async def close(self) -> None:
        await self.subscribers.close()

    # --- the request path ----------------------------------------------------------------
    async def prepare(self, info: RequestInfo) -> None:
        """Tokenize a long prompt on a thread (HF tokenizers and jinja release or share the
        GIL well enough), so that a cold 100k-token prompt does not stall the worker's loop;
        short prompts are cheaper inline than a thread hop."""
        if self.prepare_needed(info):
            info.tokens = await asyncio.to_thread(self._tokens, info)
            info.tokens_ready = True

    def prepare_needed(self, info: RequestInfo) -> bool:
        """Whether prepare() has work (a caller may skip awaiting it otherwise)."""
        return info.prompt_chars() >= OFFLOAD_CHARS

    def match(self, info: RequestInfo, approx: list[tuple[int, int]] | None,
              approx_total: int) -> tuple[list[tuple[int, int]], int] | None:
        tokens = info.tokens if info.tokens_ready else self._tokens(info)
        if tokens is None:
            return None
        a = self.args
        try:
            n, matches = self.table.match_tokens(tokens, a.block_size_to_hash, 0, a.max_blocks_to_match,
                                                 info.lora or None)
        except (TypeError, ValueError, OverflowError):  # token ids that are not u32
            self.metrics.kv_fallback_used(info.model_label, "tokenize_error")
            return None
        if self._down_ids:
            self.metrics.kv_fallback_used(info.model_label, "stream_down")
        if self._recent_used and approx_total and n and info.hashes is not None:
            recent = self._recent_matches(info.hashes)
            if recent:  # dispatched here, not yet in the engine's events: the larger counts
                up = self._up
                best = dict(matches)
                for e, m in recent.items():
                    t = m * n // approx_total
                    if e in up and t > best.get(e, 0):
                        best[e] = t
                matches = [(e, b) for e, b in best.items() if b]
        if self.branches is not None and info.hashes is not None:
            # a prefix other prompts continued differently (a shared document or system
            # prompt) keeps the approximate index's memory past the engine's eviction, so
            # its group returns where it was served; a private context (a session's) is
            # matched exactly, so an evicted one is placed by load
            depths = self.branches.observe(info.hashes)
            if depths and approx and approx_total and n:
                up = self._up
                best = dict(matches)
                for e, m in approx:
                    if e in up:
                        i = bisect.bisect_right(depths, m)
                        if i:
                            t = depths[i - 1] * n // approx_total
                            if t > best.get(e, 0):
                                best[e] = t
                matches = [(e, b) for e, b in best.items() if b]
        if approx and approx_total and n:
            # endpoints without an up stream (down, or none advertised): the approximate
            # byte-block fraction -> token blocks of this prompt
            up = self._up
            matches.extend((e, m * n // approx_total) for e, m in approx if e not in up and m * n >= approx_total)
        return matches, n

    def _tokens(self, info: RequestInfo) -> Any:
        """Token ids as vLLM would see them (array('I') or a list), or None (counted)."""
        obj = info.obj
        if info.path not in PROMPT_PATHS or type(obj) is not dict:
            return None
        chat = info.path == CHAT_PATH
        if not chat:
            prompt = obj.get("prompt")
            if isinstance(prompt, list) and prompt:
                if isinstance(prompt[0], int):
                    return prompt  # token ids (checked by the Rust call)
                prompt = prompt[0]  # a batch: the first prompt decides
                if isinstance(prompt, list):
                    return prompt
            if not isinstance(prompt, str):
                return None
        tok = self._tokenizer(info)
        if tok is None:
            self.metrics.kv_fallback_used(info.model_label, "no_tokenizer")
            return None
        try:
            if chat:
                template = self._template(info)
                if template is None:
                    self.metrics.kv_fallback_used(info.model_label, "no_tokenizer")
                    return None
                prompt = template.render(obj)
            return tok.encode(prompt, engine_adds_special_tokens(obj, chat))
        except Exception as e:  # bad messages, template errors: the engine will say so
            log.debug("kvcache-aware: cannot tokenize request %s: %r", info.request_id, e)
            self.metrics.kv_fallback_used(info.model_label, "tokenize_error")
            return None

    def _tokenizer(self, info: RequestInfo) -> CachedTokenizer | None:
        for name in (info.model, info.model_label):
            try:
                tok = self.tokenizers.get(name)
            except TokenizerUnavailable:
                return None
            if tok is not None:
                return tok
        return None

    def _template(self, info: RequestInfo) -> ChatTemplate | None:
        model = info.model if info.model in self.args.tokenizers else info.model_label
        if model not in self._templates:
            try:
                self._templates[model] = load_chat_template(self.args.tokenizers[model])
            except Exception as e:  # a broken template: fall back, once logged
                log.warning("kvcache-aware: chat template of %s unusable: %s", model, e)
                self._templates[model] = None
        return self._templates[model]

    # --- admin/debug view (not on the hot path) ------------------------------------------
    def debug_view(self) -> dict[str, Any]:
        status = self.subscribers.status()
        out: dict[str, Any] = {}
        for key, i in sorted(self.ids.items()):
            st = status.get(key)
            out[key] = {
                "id": i,
                "state": st.state.value if st else "none",
                "last_seq": st.last_seq if st else None,
                "blocks": sorted(self.table.endpoint_hashes(i)),
                **({k: getattr(st, k) for k in ("batches", "gaps", "gaps_unrecovered", "replays", "connects",
                                                "decode_errors")} if st else {}),
            }
        return {"endpoints": out, "entries": len(self.table), "overflow_drops": self.table.overflow_drops,
                "unknown_removals": self.table.unknown_removals}


def matcher_for(sc: SchedulerSettings, metrics: RouterMetrics, kv_events: KvEventsSettings) -> KvAwareMatcher | None:
    """The matcher a pipeline gets (the scheduler section's, or a PD side's: pd/side_kv.py):
    kvcache-aware listed, over every endpoint; automatic (prefix-cache, exact_auto.py),
    over the labelled ones; else None."""
    kv_args = sc.args.get("kvcache-aware")
    m = None
    if sc.enabled("kvcache-aware") and isinstance(kv_args, KvCacheAwareArgs):
        m = KvAwareMatcher(kv_args, metrics)
    else:
        auto_args = auto_exact_args(sc, kv_events)
        if auto_args is not None:  # prefix-cache + KV events where endpoints advertise them
            m = KvAwareMatcher(auto_args, metrics, auto=True)
    if m is not None and kv_events.shared_memory(m.auto):
        m.branches = BranchPoints(BRANCH_GENERATION)
    return m
