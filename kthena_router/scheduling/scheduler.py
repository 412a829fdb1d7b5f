"""The scheduling pipeline behind the proxy's `balancer.candidates(...)` call.

Per request: at most ONE prefix lookup (`PrefixIndex.match_prompt`: hash + match in Rust)
and ONE scoring call (`Scorer.schedule`: every filter and score plugin, weights, hot-spot
guard, tie-break by a hash of the request id) -> ordered endpoint ids -> EndpointStates.
No Python loop over blocks or endpoints on that path (only the result list is mapped).

Feeds, all into the Rust Scorer:
- engine snapshots from EngineStateScraper (`on_snapshot`): running/waiting/KV usage/TTFT/
  TPOT, or `mark_stale` on a failed scrape (stale = worst load, never zero), loaded LoRA
  adapters, and the engine's KV capacity, which sizes the endpoint's PrefixIndex LRU;
- the proxy's own events: `dispatched` (+1 in flight, prefix ownership recorded NOW, not
  when the response ends) and `finished` (-1, observed TTFT/TPOT), so the next request
  already sees this one; `observe_prompt_tokens` (the engine's usage.prompt_tokens), which
  teaches the index sizing the traffic's bytes per token (scheduling/index_sizing.py).

Per worker process: the Scorers (in-flight counts, EWMAs) and the approximate PrefixIndex.
Every dispatch-time insert also goes to `insert_listeners`: with several granian workers the
pod-state hub (docs/pod-state.md) relays them to the other workers' indexes, and the router
configuration's sharedPrefixIndex (kthena_router/shared_index, docs/scale-out.md) shares
them with other router replicas through Redis. Likewise every attempt's start (+1) and end
(-1) goes to `flight_listener`: the hub relays them and the other workers' Scorers count
their change since the last scrape in the endpoint's load (`remote_in_flight`), so least-request
sees the whole pod's dispatches, not one worker's.

One Scorer per ModelServer (its endpoint set); one PrefixIndex for the worker, keyed by a
seed per (ModelServer.model, LoRA adapter), so different models/adapters never match.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from kthena_router._core import BlockHashes, PrefixIndex, Scorer, prefix_key, prefix_seed
from kthena_router.endpoints.registry import EndpointState, ServerKey
from kthena_router.endpoints.selection import EndpointSelector
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import RouterMetrics

from .config import PrefixCacheArgs, PrefixHashBoundedArgs, SchedulerSettings
from .hit_realization import HitRealization
from .index_sizing import IndexSizer
from .matcher_hook import KvAwareMatcher
from .plugins import KEY_PLUGINS, PREFIX_PLUGINS
from .request import RequestInfo

log = logging.getLogger(__name__)

# Kthena's maxHashCacheSize default: entries per endpoint while the engine's KV capacity
# is unknown (no vllm:cache_config_info) and the config sets none.
DEFAULT_INDEX_CAPACITY = 50_000
MAX_CANDIDATES = 16  # retries never walk further; keeps the id -> endpoint mapping short
MISS_FRACTION = 0.5  # balanceMisses: a best match below this share of the prompt is a miss
_NAN = math.nan
_best = itemgetter(1)


class _ServerView:
    __slots__ = ("key", "label", "scorer", "eps", "by_id", "guard_seen", "kv_gen", "kv_any")

    def __init__(self, key: ServerKey, scorer: Scorer) -> None:
        self.key = key
        self.label = f"{key[0]}/{key[1]}"
        self.scorer = scorer
        self.eps: Sequence[EndpointState] | None = None  # the tuple the view was built for
        self.by_id: dict[int, EndpointState] = {}
        self.guard_seen = 0  # scorer.hot_spot_count already added to the metric
        self.kv_gen = -1  # the matcher generation kv_any was computed for (-1: stale)
        self.kv_any = False  # automatic exact matching: an endpoint of this view has a stream


class Scheduler:
    """Drop-in for RoundRobinBalancer with the plugin pipeline of a routerConfiguration."""

    needs_request_info = True

    def __init__(self, cfg: SchedulerSettings, metrics: RouterMetrics, *, hot_spot_abs: float = 64.0,
                 hot_spot_rel: float = 1.5, selector: EndpointSelector | None = None) -> None:
        self.cfg = cfg
        self.selector = selector if selector is not None else EndpointSelector()
        self.metrics = metrics
        self._filters = list(cfg.filters)
        self._scores = [(s.name, float(s.weight)) for s in cfg.scores]
        self._args = cfg.scorer_args()
        self._hot = (hot_spot_abs, hot_spot_rel)
        Scorer(self._filters, self._scores, self._args)  # validate now (ValueError)
        pa = cfg.args.get("prefix-cache")
        self.prefix_args = pa if isinstance(pa, PrefixCacheArgs) else PrefixCacheArgs()
        self.use_prefix = any(cfg.enabled(n) for n in PREFIX_PLUGINS)
        self.kv_aware = cfg.enabled("kvcache-aware")
        self.balance_misses = self.use_prefix and self.prefix_args.balance_misses
        # prefix-hash-bounded: the request's key is the hash of its leading prompt blocks
        ka = cfg.args.get("prefix-hash-bounded")
        self.key_args = ka if isinstance(ka, PrefixHashBoundedArgs) else PrefixHashBoundedArgs()
        self.use_key = any(cfg.enabled(n) for n in KEY_PLUGINS)
        # prefill-cost: each dispatch's uncached blocks are pending there until its first token
        self.learn_cost = cfg.enabled("prefill-cost")
        pc = cfg.args.get("prefill-cost")  # realizedPrefix: measure what engines still hold
        self.realization = HitRealization() if self.learn_cost and getattr(pc, "realized_prefix", False) else None
        self.kv_matcher: KvAwareMatcher | None = None
        self._kv_dispatched: Callable[[int, BlockHashes], None] | None = None
        fixed = self.prefix_args.max_hash_cache_size
        # balanceMisses places a miss by the traffic the index's inserts counted
        self.index = PrefixIndex(fixed if fixed is not None else DEFAULT_INDEX_CAPACITY,
                                 hint_slots=self.prefix_args.evicted_hint_slots,
                                 traffic_block_bytes=self.prefix_args.block_size_to_hash if self.balance_misses else 0)
        # Capacity per endpoint follows its engine's KV unless maxHashCacheSize is set.
        self._sizer = IndexSizer(self.prefix_args.block_size_to_hash) if fixed is None else None
        self._kv_tokens: dict[int, int] = {}  # endpoint id -> engine KV capacity in tokens
        self._capacity: dict[int, int] = {}
        self._views: dict[ServerKey, _ServerView] = {}
        self._ids: dict[str, int] = {}  # endpoint key "ip:port" -> u32 id (never reused)
        self._next_id = 0
        self._scorers_of: dict[str, list[Scorer]] = {}  # endpoint key -> scorers holding it
        self._views_of: dict[str, list[_ServerView]] = {}  # endpoint key -> views holding it
        self._seeds: dict[tuple[str, str], int] = {}
        self._lora_ids: dict[str, int] = {}
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self._kv_fallback_reason = "no_event_subscriber"
        # every dispatch-time insert, by listener name ("pod-state", "shared-index"): each
        # buffers or queues it, none does I/O here
        self.insert_listeners: dict[str, Callable[[str, BlockHashes], None]] = {}
        # (endpoint key, +1 / -1, LoRA adapter or "") per attempt started / ended: the hub's relay
        self.flight_listener: Callable[[str, int, str], None] | None = None

    # --- configuration / endpoint set ----------------------------------------------------
    async def prepare(self, info: RequestInfo) -> None:
        """Work that may block (tokenizing a long prompt) done before candidates(), off the loop."""
        if self.prepare_needed(info):
            await self.kv_matcher.prepare(info)  # type: ignore[union-attr]

    def prepare_needed(self, info: RequestInfo) -> bool:
        """Whether prepare() has work (else a caller may skip awaiting it: no task per request)."""
        m = self.kv_matcher
        if m is None or not (self.kv_aware or m.sourced):
            return False
        needed = getattr(m, "prepare_needed", None)  # a matcher without it: always await
        return needed is None or bool(needed(info))

    def set_kv_matcher(self, matcher: KvAwareMatcher | None) -> None:
        """kvcache-aware's matcher; or, under prefix-cache, the automatic one
        (scheduling/exact_auto.py), consulted only for views with an endpoint that has a
        stream, so a pipeline whose endpoints publish nothing pays nothing for it."""
        self.kv_matcher = matcher
        self._kv_dispatched = getattr(matcher, "dispatched", None)

    def sync(self, targets: Mapping[ServerKey, Sequence[EndpointState]]) -> list[EndpointState]:
        """Reconcile with a new routing state; returns one EndpointState per live key (for
        the scraper). Endpoints that disappeared are purged from index and scorers."""
        live: dict[str, EndpointState] = {}
        for key, eps in targets.items():
            view = self._views.get(key)
            if view is None:
                view = self._views[key] = _ServerView(key, self._new_scorer())
            self._rebuild(view, eps)
            for ep in eps:
                live.setdefault(ep.key, ep)
        for key in [k for k in self._views if k not in targets]:
            view = self._views.pop(key)
            for ep_id in view.scorer.endpoints():
                view.scorer.remove_endpoint(ep_id)
            self._rebuild_scorers_of()
        for ep_key in [k for k in self._ids if k not in live]:
            ep_id = self._ids.pop(ep_key)
            self.index.remove_endpoint(ep_id)
            self._capacity.pop(ep_id, None)
            if self.realization is not None:
                self.realization.forget(ep_id)
            self._kv_tokens.pop(ep_id, None)
            self._snapshots.pop(ep_key, None)
        self._rebuild_scorers_of()
        return list(live.values())

    def _new_scorer(self) -> Scorer:
        return Scorer(self._filters, self._scores, self._args, hot_spot_abs=self._hot[0],
                      hot_spot_rel=self._hot[1], max_candidates=MAX_CANDIDATES)

    def _id(self, ep_key: str) -> int:
        ep_id = self._ids.get(ep_key)
        if ep_id is None:
            ep_id = self._ids[ep_key] = self._next_id
            self._next_id += 1
        return ep_id

    def _rebuild(self, view: _ServerView, eps: Sequence[EndpointState]) -> None:
        """Point the view at `eps` (a new tuple after every state swap); O(endpoints), only
        when the tuple changed."""
        by_id = {self._id(ep.key): ep for ep in eps}
        scorer = view.scorer
        for ep_id in scorer.endpoints():
            if ep_id not in by_id:
                scorer.remove_endpoint(ep_id)
        known = set(scorer.endpoints())
        for ep_id, ep in by_id.items():
            if ep_id not in known:
                # the address, not the id, is what every router replica agrees on
                scorer.add_endpoint(ep_id, ep.key.encode())
                snap = self._snapshots.get(ep.key)
                if snap is not None:
                    self._push(scorer, ep_id, snap)
        view.eps = eps
        view.by_id = by_id
        view.kv_gen = -1
        self._rebuild_scorers_of()

    def _rebuild_scorers_of(self) -> None:
        views: dict[str, list[_ServerView]] = {}
        for view in self._views.values():
            for ep in view.by_id.values():
                views.setdefault(ep.key, []).append(view)
        self._views_of = views
        self._scorers_of = {k: [v.scorer for v in vs] for k, vs in views.items()}

    # --- the hot path --------------------------------------------------------------------
    def candidates(self, key: ServerKey, endpoints: Sequence[EndpointState],
                   info: RequestInfo | None = None) -> list[EndpointState]:
        """Usable endpoints (endpoints/selection.py), best first (at most MAX_CANDIDATES).
        An endpoint that is ejected or whose in-flight attempts make no progress is left
        out however well it scores (prefix affinity must not pile onto a stalled engine);
        in panic every ranked endpoint stays."""
        if not endpoints:
            return []
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = _ServerView(key, self._new_scorer())
        if view.eps is not endpoints:
            self._rebuild(view, endpoints)
        t0 = time.perf_counter()
        matches: list[tuple[int, int]] | None = None
        total = 0
        lora_id: int | None = None
        rid_hash = 0
        hash_key: int | None = None  # prefix-hash-bounded's (`key` is the ModelServer's)
        model = ""
        if info is not None:
            model = info.model_label
            rid_hash = Scorer.request_hash(info.request_id.encode())
            if info.lora:
                lora_id = self._lora_id(info.lora)
            if self.use_prefix:
                matches, total = self._match(info, view)
            if self.use_key:
                hash_key = self._prefix_key(info)
        if self.learn_cost and info is not None:
            info.matched = (self, dict(matches) if matches else {}, total)
        best_fraction = max(matches, key=_best)[1] / total if matches and total else 0.0
        if self.balance_misses and total and best_fraction < MISS_FRACTION and lora_id is None:
            # a LoRA request's place is its adapter's batch (lora-affinity), not the prefix load
            matches = self.index.miss_scores(list(view.by_id), total)
        t1 = time.perf_counter()
        ids = view.scorer.schedule(rid_hash, matches, lora_id, total, hash_key)
        t2 = time.perf_counter()
        by_id = view.by_id
        usable, panic = self.selector.usable(key, endpoints)
        out = [ep for ep in map(by_id.get, ids) if ep is not None]
        if not panic and len(usable) < len(endpoints):
            ok = set(usable)
            out = [ep for ep in out if ep in ok]
        if not out:  # every ranked one is out: any usable endpoint still beats a 503
            out = usable
        m = self.metrics
        if self.use_prefix:
            m.observe_plugin(model, "prefix-cache", "match", t1 - t0)
            if total:
                m.observe_prefix_ratio(model, best_fraction)
        m.observe_plugin(model, "pipeline", "schedule", t2 - t1)
        if out:
            m.decision(view.label, out[0].key)
        return out

    def approx_match(self, info: RequestInfo) -> tuple[list[tuple[int, int]] | None, int]:
        """The prompt's match on this scheduler's approximate index: ([(endpoint id, matched
        blocks)], total blocks); (None, 0) without a prompt we understand. The prompt is
        rendered and hashed once per request and prefix args (kept on `info`)."""
        pa = self.prefix_args
        tag = (pa.block_size_to_hash, pa.max_blocks_to_match, self._seed(info.model, info.lora))
        if info.hash_tag == tag:
            hashes = info.hashes
            return (None, 0) if hashes is None else (self.index.match_hashes(hashes), len(hashes))
        prompt = info.prompt()
        info.hash_tag = tag
        if prompt is None:
            info.hashes, info.prompt_bytes = None, 0
            return None, 0
        hashes, matches = self.index.match_prompt(prompt, pa.block_size_to_hash, tag[2], pa.max_blocks_to_match)
        info.hashes = hashes
        info.prompt_bytes = len(prompt)
        return matches, len(hashes)

    def _prefix_key(self, info: RequestInfo) -> int | None:
        """The consistent-hash key of the request (prefix-hash-bounded): the chain hash of
        its first `prefixKeyBlocks` blocks; None without a prompt we understand (the
        request id's hash then stands in). Kept on `info` for retries and PD's two sides."""
        ka = self.key_args
        tag = (ka.block_size_to_hash, ka.prefix_key_blocks, self._seed(info.model, info.lora))
        if info.key_tag != tag:
            prompt = info.prompt()
            info.key_tag = tag
            info.prefix_key = None if prompt is None else prefix_key(prompt, tag[0], tag[2], tag[1])
        return info.prefix_key

    def _match(self, info: RequestInfo, view: _ServerView) -> tuple[list[tuple[int, int]] | None, int]:
        matches, total = self.approx_match(info)
        if matches is None:
            return None, 0
        m = self.kv_matcher
        if self.kv_aware:
            if m is None:
                self.metrics.kv_fallback_used(info.model_label, self._kv_fallback_reason)
            else:  # the matcher counts its own fallbacks (with their reasons)
                exact = m.match(info, matches, total)
                if exact is not None:
                    matches, total = exact
        elif m is not None:  # automatic exact matching under prefix-cache
            if view.kv_gen != m.generation:
                view.kv_gen = m.generation
                view.kv_any = not m.sourced.isdisjoint(view.by_id)
            if view.kv_any:
                exact = m.match(info, matches, total)
                if exact is not None:
                    matches, total = exact
        return matches, total

    def _seed(self, model: str, lora: str) -> int:
        seed = self._seeds.get((model, lora))
        if seed is None:
            seed = self._seeds[(model, lora)] = prefix_seed(model.encode(), lora.encode())
        return seed

    def _lora_id(self, name: str) -> int:
        lid = self._lora_ids.get(name)
        if lid is None:
            lid = self._lora_ids[name] = len(self._lora_ids)
        return lid

    def dispatched(self, ep: EndpointState, info: RequestInfo | None) -> None:
        """An attempt goes to `ep` now: count it in flight and record prefix ownership."""
        ep_id = self._ids.get(ep.key)
        if ep_id is None:
            return
        scorers = self._scorers_of.get(ep.key, ())
        for scorer in scorers:
            scorer.add_in_flight(ep_id, 1)
        lora = info.lora if info is not None and info.lora else ""
        if lora:
            lid = self._lora_id(lora)
            for scorer in scorers:
                scorer.add_lora_in_flight(ep_id, lid, 1)
        if self.flight_listener is not None:
            self.flight_listener(ep.key, 1, lora)
        if self.learn_cost and info is not None and info.matched is not None and info.matched[0] is self:
            _, matched, total = info.matched
            blocks = float(total - matched.get(ep_id, 0))
            for scorer in scorers:
                scorer.add_pending(ep_id, blocks)
            info.pending = (self, scorers, ep_id, blocks)
            if self.realization is not None:
                self.realization.dispatched(ep_id, total - blocks, total)
        if info is not None and info.hashes is not None and len(info.hashes):
            self.index.insert(ep_id, info.hashes)
            if self._kv_dispatched is not None:  # the matcher's in-flight overlay (kv_matcher.RECENT_S)
                self._kv_dispatched(ep_id, info.hashes)
            if self.insert_listeners:
                for listener in self.insert_listeners.values():
                    listener(ep.key, info.hashes)

    # --- the Rust front's decisions (front/table.py) ----------------------------------------
    def front_eligible(self) -> bool:
        """Whether the front may decide with this pipeline alone: the prefix match, the Scorer
        and the attempts (prefill-cost's pending work included). Not with a consistent-hash key
        or kvcache-aware's exact matching (their per-request work is Python's)."""
        return not (self.use_key or self.kv_aware)

    def front_view(self, key: ServerKey, eps: Sequence[EndpointState]) -> tuple[Scorer, list[int]] | None:
        """The Scorer of server `key` and its endpoint ids in `eps` order, for the front; None
        when an endpoint there has a KV-event stream (automatic exact matching is Python's)."""
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = _ServerView(key, self._new_scorer())
        if view.eps is not eps:
            self._rebuild(view, eps)
        m = self.kv_matcher
        if m is not None and not m.sourced.isdisjoint(view.by_id):
            return None
        return view.scorer, [self._ids[ep.key] for ep in eps]

    def front_prefix(self) -> tuple[PrefixIndex, int, int, bool, bool] | None:
        """The index and the arguments the front matches with, if a prefix plugin scores, and
        whether it counts prefill-cost's pending work."""
        if not self.use_prefix:
            return None
        pa = self.prefix_args
        return self.index, pa.block_size_to_hash, pa.max_blocks_to_match, self.balance_misses, self.learn_cost

    def front_seed(self, model: str) -> int:
        """The prefix chain's seed for a base model's requests."""
        return self._seed(model, "")

    def front_dispatched(self, key: ServerKey, ep: EndpointState, info: RequestInfo, match_s: float,
                         schedule_s: float, best: float, pending: float = -1.0) -> None:
        """The front decided `info` for `ep` of server `key`: it counted the attempt in flight on
        that server's Scorer, added `pending` blocks to its pending work (prefill-cost; < 0:
        none) and inserted the prompt's blocks; the rest of `dispatched` (other servers'
        Scorers' flight and pending counts, the relays) and `candidates`' metrics are done here."""
        ep_id = self._ids.get(ep.key)
        view = self._views.get(key)
        if ep_id is not None:
            own = view.scorer if view is not None else None
            scorers = self._scorers_of.get(ep.key, ())
            counted = own is not None and pending >= 0
            for scorer in scorers:
                if scorer is not own:
                    scorer.add_in_flight(ep_id, 1)
                    if counted:  # as `dispatched`: every Scorer that holds the endpoint
                        scorer.add_pending(ep_id, pending)
            if counted:
                info.pending = (self, scorers, ep_id, pending)
                if self.realization is not None and info.hashes is not None:
                    self.realization.dispatched(ep_id, len(info.hashes) - pending, len(info.hashes))
            if self.flight_listener is not None:
                self.flight_listener(ep.key, 1, "")  # the front decides base-model requests only
            hashes = info.hashes
            if hashes is not None and len(hashes):
                if self._kv_dispatched is not None:
                    self._kv_dispatched(ep_id, hashes)
                if self.insert_listeners:
                    for listener in self.insert_listeners.values():
                        listener(ep.key, hashes)
        m = self.metrics
        model = info.model_label
        if self.use_prefix:
            m.observe_plugin(model, "prefix-cache", "match", match_s)
            if best >= 0:
                m.observe_prefix_ratio(model, best)
        m.observe_plugin(model, "pipeline", "schedule", schedule_s)
        if view is not None:
            m.decision(view.label, ep.key)

    def finished(self, ep: EndpointState, ttft_s: float | None = None, tpot_s: float | None = None,
                 info: RequestInfo | None = None) -> None:
        """The attempt on `ep` ended (any outcome); latencies as this router measured them;
        `info` as `dispatched` had it."""
        ep_id = self._ids.get(ep.key)
        if ep_id is None:
            return
        lid = self._lora_id(info.lora) if info is not None and info.lora else None
        if info is not None and info.pending is not None and info.pending[0] is self:
            info.prefilled()  # no first token seen (not streamed, or failed): released now
        for scorer in self._scorers_of.get(ep.key, ()):
            scorer.add_in_flight(ep_id, -1)
            if lid is not None:
                scorer.add_lora_in_flight(ep_id, lid, -1)
            if ttft_s is not None or tpot_s is not None:
                scorer.observe_latency(ep_id, _NAN if ttft_s is None else ttft_s,
                                       _NAN if tpot_s is None else tpot_s)
        if self.flight_listener is not None:
            self.flight_listener(ep.key, -1, info.lora if info is not None and info.lora else "")

    def remote_in_flight(self, ep_key: str, delta: int, lora: str = "") -> None:
        """The pod's other workers started (+) / ended (-) `delta` attempts on `ep_key`
        (with `lora`: their attempts for that adapter, lora-affinity's batch view)."""
        ep_id = self._ids.get(ep_key)
        if ep_id is None:
            return
        for scorer in self._scorers_of.get(ep_key, ()):
            if lora:
                scorer.add_remote_lora_in_flight(ep_id, self._lora_id(lora), delta)
            else:
                scorer.add_remote_in_flight(ep_id, delta)

    def clear_remote_loras(self) -> None:
        """The hub connection changed: relayed adapter counts have no history to follow."""
        for view in self._views.values():
            view.scorer.clear_remote_loras()

    # --- engine state ----------------------------------------------------------------------
    def on_snapshot(self, snap: EndpointSnapshot) -> None:
        """EngineStateScraper callback, after every scrape (success or failure)."""
        ep_id = self._ids.get(snap.key)
        if ep_id is None:
            return
        prev = self._snapshots.get(snap.key)
        # never scraped and not stale: an assumed state (PD without a scraper), not a scrape
        if (prev is None or prev.stale != snap.stale) and (snap.stale or snap.scraped_at is not None):
            self.metrics.set_metrics_stale(snap.key, snap.stale)
        self._snapshots[snap.key] = snap
        real = self.realization
        measured = None if real is None else real.scraped(ep_id, None if snap.stale else snap.prefix_hit_rate)
        for view in self._views_of.get(snap.key, ()):
            self._push(view.scorer, ep_id, snap)
            if measured is not None:
                view.scorer.set_realization(ep_id, measured)
            # the guard's decisions, counted in Rust, published at scrape pace (not per request)
            n = view.scorer.hot_spot_count
            if n != view.guard_seen:
                self.metrics.hot_spot_reorders(view.label, n - view.guard_seen)
                view.guard_seen = n
        self._size_index(ep_id, snap)

    def _push(self, scorer: Scorer, ep_id: int, snap: EndpointSnapshot) -> None:
        if snap.stale:
            scorer.mark_stale(ep_id)
        else:
            scorer.update_metrics(ep_id, _f(snap.running), _f(snap.waiting), _f(snap.kv_usage),
                                  _f(snap.ttft_mean_s), _f(snap.tpot_mean_s))
        loras = snap.last_loaded_loras
        if loras is None and snap.last_running_loras is not None:
            loras = tuple(set(snap.last_running_loras) | set(snap.last_waiting_loras or ()))
        if loras is not None:
            scorer.set_loras(ep_id, [self._lora_id(n) for n in loras], snap.last_max_lora or 0)
        if not snap.stale and snap.last_running_loras is not None:  # what the engine runs or queues
            listed = set(snap.last_running_loras) | set(snap.last_waiting_loras or ())
            scorer.retain_remote_loras(ep_id, [self._lora_id(n) for n in listed])

    def observe_prompt_tokens(self, info: RequestInfo, prompt_tokens: int) -> None:
        """The engine's prompt size for a request whose prompt we hashed: learn bytes per
        token; on a significant change, resize every endpoint's index."""
        sizer = self._sizer
        if sizer is None or not info.prompt_bytes:
            return
        if sizer.observe(info.prompt_bytes, prompt_tokens):
            sizer.apply()
            for ep_id in self._kv_tokens:
                self._apply_capacity(ep_id)
            self._publish_sizing()

    def _size_index(self, ep_id: int, snap: EndpointSnapshot) -> None:
        """Record the engine's KV capacity (tokens) and size the endpoint's index from it."""
        if self._sizer is None or not snap.num_gpu_blocks:
            return
        tokens = snap.num_gpu_blocks * (snap.block_size or 16)
        if self._kv_tokens.get(ep_id) != tokens:
            self._kv_tokens[ep_id] = tokens
            self._apply_capacity(ep_id)
            self._publish_sizing()

    def _apply_capacity(self, ep_id: int) -> None:
        assert self._sizer is not None
        cap = self._sizer.capacity(self._kv_tokens[ep_id])
        if self._capacity.get(ep_id) != cap:
            self._capacity[ep_id] = cap
            self.index.set_capacity(ep_id, cap)

    def _publish_sizing(self) -> None:
        assert self._sizer is not None
        by_id = {i: k for k, i in self._ids.items()}
        self.metrics.set_index_sizing(self._sizer.applied, {by_id[i]: c for i, c in self._capacity.items()
                                                            if i in by_id})

    # --- views for admin/tests -------------------------------------------------------------
    def endpoint_id(self, ep_key: str) -> int | None:
        return self._ids.get(ep_key)

    def flight_counts(self, ep_key: str) -> dict[str, int] | None:
        """This worker's attempts on `ep_key` in flight, and the other workers' as relayed,
        as its first Scorer holds them (/debug/pod_state)."""
        ep_id = self._ids.get(ep_key)
        scorers = self._scorers_of.get(ep_key)
        sig = scorers[0].signals(ep_id) if ep_id is not None and scorers else None
        if sig is None:
            return None
        return {"local": int(sig["in_flight"]), "remote": int(sig["remote_in_flight"])}

    def debug_view(self) -> dict[str, Any]:
        """/debug/scheduler: per ModelServer, what each endpoint's scorer decides on (engine
        running/waiting at the last scrape, in-flight since, the load least-request sees)."""
        servers: dict[str, Any] = {}
        lora_names = {i: n for n, i in self._lora_ids.items()}
        for view in self._views.values():
            eps = {}
            for ep_id, ep in view.by_id.items():
                sig = view.scorer.signals(ep_id)
                if sig is not None:
                    eps[ep.key] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                   for k, v in sig.items() if k not in ("loras", "lora_in_flight", "lora_remote")}
                    for k in ("lora_in_flight", "lora_remote"):
                        eps[ep.key][k] = {lora_names.get(i, str(i)): n for i, n in sig[k]}
            servers[view.label] = eps
        return {"servers": servers}

    def signals(self, key: ServerKey, ep_key: str) -> dict[str, Any] | None:
        view = self._views.get(key)
        ep_id = self._ids.get(ep_key)
        if view is None or ep_id is None:
            return None
        return view.scorer.signals(ep_id)


def _f(v: float | int | None) -> float:
    return _NAN if v is None else float(v)
