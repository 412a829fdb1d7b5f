"""Pairing: the decode endpoint first (decode-side plugins), then a prefill endpoint of its
group (prefill-side plugins), both scored by the Rust Scorer (scheduling/scheduler.py).

One Scheduler per side per worker, each with its own approximate prefix index (its
dispatch-time inserts shared like the plain scheduler's: `set_insert_listener`, through
the pod-state hub and sharedPrefixIndex, each record named by its side):
- decode views, one per PD ModelServer over every decode endpoint of its paired groups,
  key (namespace, name, "decode"); the decode index records the prompt of every request
  an endpoint decoded (two hops or alone: either way it ends up holding the prompt's KV);
- prefill views, one per group, key (namespace, name, "prefill", group); the prefill
  index records what each prefill engine computed, so `prefix-cache` (the prefill
  default) sends a prompt to the prefill engine that already holds its prefix.

`pairs()` is the dispatcher's candidate list, best first: every usable decode endpoint in
decode order, each with a prefill endpoint of ITS group (never across groups). The k-th
decode endpoint of a group gets the group's k-th best prefill (round the ranking), so the
dispatcher's retry, which moves to the next pair, does not land on the prefill that just
failed when the group has another.

Conditional disaggregation (pd.minUncachedTokens, llm-d's rule): when the prompt part the
chosen decode endpoint does not hold is estimated below the threshold, the first pair is
(decode, None): that engine prefills it itself. Later pairs stay two-hop. The estimate
(docs/pd.md): the prefix index works in blocks of `blockSizeToHash` BYTES of the rendered
prompt (a trailing partial block is never hashed); uncached bytes = prompt bytes - matched
blocks x block size, converted to tokens with the bytes per token learned from the
engines' usage.prompt_tokens (scheduling/index_sizing.py; 4 before any report).

Exact KV events (pd/side_kv.py): a side that lists kvcache-aware, or scores prefix-cache
under `kvEvents.exactMatching: auto` with tokenizers, follows its own engines' KV-event
streams and matches exactly where a stream is up (the side's approximate index elsewhere).

Reloads: each side's Scheduler sits behind a SwitchingBalancer, so attempts dispatched
before a new pipeline was installed finish without touching the new one's counts.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry

from kthena_router.config.model import SGLANG_BOOTSTRAP
from kthena_router.endpoints.registry import EndpointState
from kthena_router.endpoints.selection import EndpointSelector, T
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import RouterMetrics
from kthena_router.router_config_reload import SwitchingBalancer
from kthena_router.scheduling.check import check_scheduler
from kthena_router.scheduling.index_sizing import IndexSizer
from kthena_router.scheduling.insert_scopes import PD_DECODE, PD_PREFILL, Listener, scoped
from kthena_router.scheduling.scheduler import Scheduler

from . import side_kv
from .config import DEFAULT_PD, PdServerSettings, PdSettings
from .config_parse import side_settings
from .pairing_metrics import PdPairingMetrics
from .topology import PdTopology

log = logging.getLogger(__name__)

__all__ = ["PdBuild", "PdPair", "PdPairer"]

DECODE, PREFILL = "decode", "prefill"


class PdPair(NamedTuple):
    decode: EndpointState
    prefill: EndpointState | None  # None: conditional disaggregation sends the request to decode alone
    group: str


@dataclass(frozen=True, slots=True)
class PdBuild:
    """Schedulers built (and checked) for a new pd section; None = that side is unchanged."""

    settings: PdSettings
    decode: Scheduler | None
    prefill: Scheduler | None


class _ServerSelector(EndpointSelector):
    """The worker's EndpointSelector asked with the ModelServer's key for a side view's key,
    so the server's panic threshold (traffic section) and panic metric apply."""

    def __init__(self, inner: EndpointSelector) -> None:
        self.inner = inner  # a pure delegate: no state of its own (no super().__init__)

    def threshold(self, key: Hashable) -> float:
        return self.inner.threshold(_server_key(key))

    def usable(self, key: Hashable, endpoints: Sequence[T], now: float | None = None) -> tuple[list[T], bool]:
        return self.inner.usable(_server_key(key), endpoints, now)


def _server_key(key: Hashable) -> Hashable:
    return key[:2] if isinstance(key, tuple) else key


def _idle(key: str) -> EndpointSnapshot:
    """Without a scraper (no --router-config): the engine's own queue is unknown for good,
    and an endpoint never scraped counts as worst (stale) in the Scorer, which would hide
    the router's in-flight counts. Assume an idle engine: load = what this worker sent."""
    return EndpointSnapshot(key, "", None, 0.0, False, 0, None, last_running=0, last_waiting=0)


class PdPairer:
    """Per worker. `pairs` is the hot path: candidate pairs, best first (the dispatcher moves
    to the next pair on a failure before the first byte reaches the client)."""

    def __init__(self, settings: PdSettings = DEFAULT_PD, metrics: RouterMetrics | None = None, *,
                 selector: EndpointSelector | None = None, hot_spot_abs: float = 64.0, hot_spot_rel: float = 1.5,
                 scraped: bool = False, source: str = "<pd defaults>") -> None:
        self.metrics = metrics if metrics is not None else RouterMetrics(CollectorRegistry())
        self.pd_metrics = PdPairingMetrics(self.metrics.registry)
        self._selector = _ServerSelector(selector if selector is not None else EndpointSelector())
        self._hot = (hot_spot_abs, hot_spot_rel)
        self.scraped = scraped  # an EngineStateScraper feeds on_snapshot (else: _idle)
        self.settings = DEFAULT_PD
        build = self.build(settings, source, force=True)
        assert build.decode is not None and build.prefill is not None
        self.decode = SwitchingBalancer(build.decode)
        self.prefill = SwitchingBalancer(build.prefill)
        self.settings = settings
        self._ratio = IndexSizer(1)  # only its bytes-per-token estimate (uncached tokens)
        self._state: Any = None  # the last RouterState (a rebuilt side is synced with it)
        self._snaps: dict[str, EndpointSnapshot] = {}  # last engine state of PD endpoints
        self._live: frozenset[str] = frozenset()  # keys of the endpoints in pairs
        self._reported: dict[str, tuple[str | None, tuple[str, ...], bool]] = {}  # server -> logged
        # shared dispatch-time inserts (pod-state hub, sharedPrefixIndex), by listener name
        self._insert_listeners: dict[str, Listener] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # replaced sides' matchers closing

    def set_insert_listener(self, name: str, listener: Listener | None) -> None:
        """Send both sides' dispatch-time inserts to `listener` (None: stop), each record
        named by its side (scheduling/insert_scopes.py); schedulers a reload builds get it too."""
        if listener is None:
            self._insert_listeners.pop(name, None)
        else:
            self._insert_listeners[name] = listener
        for side, balancer in ((DECODE, self.decode), (PREFILL, self.prefill)):
            self._bind(side, balancer.inner)

    def _bind(self, side: str, sched: Scheduler) -> None:
        scope = PD_DECODE if side == DECODE else PD_PREFILL
        sched.insert_listeners.clear()
        for name, listener in self._insert_listeners.items():
            sched.insert_listeners[name] = scoped(scope, listener)

    # --- configuration ---------------------------------------------------------------------
    def build(self, settings: PdSettings, source: str, *, force: bool = False) -> PdBuild:
        """New Schedulers for the sides whose pipeline differs from the installed one.
        ConfigError (naming `pd.decode` / `pd.prefill`) if Rust refuses a pipeline."""
        out: dict[str, Scheduler | None] = {}
        for side in (DECODE, PREFILL):
            sc, old = side_settings(settings, side), side_settings(self.settings, side)
            if not force and sc == old and (side_kv.exact_mode(sc, settings.kv_events)
                                            == side_kv.exact_mode(old, self.settings.kv_events)):
                out[side] = None
                continue
            check_scheduler(sc, source, f"pd.{side}")
            sched = Scheduler(sc, self.metrics, hot_spot_abs=self._hot[0], hot_spot_rel=self._hot[1],
                              selector=self._selector)
            side_kv.attach(sched, sc, settings.kv_events, self.metrics)
            out[side] = sched
        return PdBuild(settings, out[DECODE], out[PREFILL])

    def install(self, build: PdBuild) -> None:
        """Swap in a build (synced with the current endpoints and their last engine state)."""
        for side, new in ((DECODE, build.decode), (PREFILL, build.prefill)):
            if new is None:
                continue
            if self._state is not None:
                self._sync_side(side, new, self._state)
            for snap in self._snaps.values():
                new.on_snapshot(snap)
            self._bind(side, new)
            balancer = self.decode if side == DECODE else self.prefill
            old = balancer.inner
            balancer.swap(new)
            side_kv.retire(old, self._tasks)
            self._spawn(side_kv.load_tokenizers(new))
        self.settings = build.settings
        if self._state is not None:
            self._report(self._state.pd)

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (unit tests): tokenizers load on first use
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Lifespan: load the side matchers' tokenizers before traffic."""
        for b in (self.decode, self.prefill):
            await side_kv.load_tokenizers(b.inner)

    async def close(self) -> None:
        """Lifespan end: close the side matchers' KV-event subscriptions."""
        await asyncio.gather(*self._tasks, return_exceptions=True)  # retired matchers closing
        for b in (self.decode, self.prefill):
            m = b.inner.kv_matcher
            if m is not None:
                await m.close()  # type: ignore[attr-defined]  # a KvAwareMatcher

    def kv_streams_not_up(self) -> set[str]:
        """Endpoint keys followed by a side matcher whose stream is not up (warmup)."""
        out: set[str] = set()
        for b in (self.decode, self.prefill):
            m = b.inner.kv_matcher
            if m is not None:
                out |= m.streams_not_up()  # type: ignore[attr-defined]
        return out

    def configure(self, settings: PdSettings, source: str = "<pd>") -> None:
        """build + install (ConfigError leaves the installed pipelines)."""
        if settings != self.settings:
            self.install(self.build(settings, source))

    # --- routing state / engine state ------------------------------------------------------
    def on_state(self, state: Any) -> None:
        """After every routing-state install: views over the new topologies, endpoints that
        left purged, PD problems logged (once per change) and published."""
        self._state = state
        for side, balancer in ((DECODE, self.decode), (PREFILL, self.prefill)):
            self._sync_side(side, balancer.inner, state)
        live = self._live = frozenset(key for topo in state.pd.values() for key in topo.group_of)
        for key in [k for k in self._snaps if k not in live]:
            del self._snaps[key]
        if not self.scraped:
            for key in live - set(self._snaps):
                self.on_snapshot(_idle(key))
        self._report(state.pd)

    @staticmethod
    def _sync_side(side: str, sched: Scheduler, state: Any) -> None:
        views: dict[Hashable, tuple[EndpointState, ...]] = {}
        for (ns, name), topo in state.pd.items():
            if side == DECODE:
                if topo.decode:
                    views[(ns, name, DECODE)] = topo.decode
            else:
                for g in topo.groups.values():
                    views[(ns, name, PREFILL, g.name)] = g.prefill
        sched.sync(views)  # type: ignore[arg-type]  # any hashable view key works
        side_kv.follow(sched, views)

    def on_snapshot(self, snap: EndpointSnapshot) -> None:
        """EngineStateScraper callback (via the router-config reloader)."""
        if snap.key not in self._live:
            return
        self._snaps[snap.key] = snap
        self.decode.inner.on_snapshot(snap)
        self.prefill.inner.on_snapshot(snap)

    def _report(self, topos: Any) -> None:
        labels = {f"{ns}/{name}": topo for (ns, name), topo in topos.items()}
        for (ns, name), topo in topos.items():
            label = f"{ns}/{name}"
            # minUncachedTokens cannot apply to SGLang (it never decodes alone): said, not ignored silently
            inert = topo.connector == SGLANG_BOOTSTRAP and self.settings.for_server(ns, name).min_uncached_tokens > 0
            now = (topo.problem, topo.ignored, inert)
            before = self._reported.get(label)
            if before == now:
                continue
            if topo.problem:
                log.warning("PD ModelServer %s cannot serve (requests get 503): %s", label, topo.problem)
            elif before is not None and before[0]:
                log.info("PD ModelServer %s forms prefill/decode pairs again (%d groups)", label, len(topo.groups))
            if topo.ignored and (before is None or before[1] != topo.ignored):
                log.warning("PD ModelServer %s: %d endpoint(s) take no part in pairs: %s", label,
                            len(topo.ignored), "; ".join(topo.ignored))
            if inert and (before is None or not before[2]):
                log.warning("PD ModelServer %s: pd.minUncachedTokens has no effect on SGLang servers (both hops "
                            "always run at once)", label)
            self._reported[label] = now
        for label in [k for k in self._reported if k not in labels]:
            del self._reported[label]
        self.pd_metrics.set_topologies(labels)

    # --- the hot path --------------------------------------------------------------------
    async def prepare(self, info: Any) -> None:
        """Blocking work (tokenizing) before pairs(), off the loop."""
        await self.decode.prepare(info)
        await self.prefill.prepare(info)

    def pairs(self, topo: PdTopology, info: Any, settings: PdServerSettings) -> list[PdPair]:
        if not topo.decode:
            return []
        ns, name = topo.server_key
        decode = self.decode.candidates((ns, name, DECODE), topo.decode, info)
        if not decode:
            return []
        # SGLang decode engines cannot serve without their prefill peer: never alone there
        alone = (settings.min_uncached_tokens > 0 and info is not None and topo.connector != SGLANG_BOOTSTRAP
                 and self.uncached_tokens(decode[0], info) < settings.min_uncached_tokens)
        ranked: dict[str, list[EndpointState]] = {}  # group -> its prefill ranking (once per group)
        used: dict[str, int] = {}
        out: list[PdPair] = []
        for i, d in enumerate(decode):
            group = topo.group_of[d.key]
            if alone and i == 0:
                out.append(PdPair(d, None, group))
                continue
            ranking = ranked.get(group)
            if ranking is None:
                ranking = ranked[group] = self.prefill.candidates((ns, name, PREFILL, group),
                                                                  topo.groups[group].prefill, info)
            if not ranking:  # no usable prefill in this group (panic off): its decodes cannot pair
                continue
            k = used.get(group, 0)
            used[group] = k + 1
            out.append(PdPair(d, ranking[k % len(ranking)], group))
        if out:
            self.pd_metrics.decision(f"{ns}/{name}", "decode_only" if out[0].prefill is None else "two_hop")
        return out

    def uncached_tokens(self, decode: EndpointState, info: Any) -> float:
        """Estimated prompt tokens `decode` does not hold (inf: no prompt we can hash, so
        never decode alone on a guess)."""
        sched = self.decode.inner
        matches, _ = sched.approx_match(info)
        if matches is None or not info.prompt_bytes:
            return math.inf
        ep_id = sched.endpoint_id(decode.key)
        blocks = next((b for i, b in matches if i == ep_id), 0)
        uncached = max(0, info.prompt_bytes - blocks * sched.prefix_args.block_size_to_hash)
        return uncached / self._ratio.bytes_per_token

    def dispatched(self, ep: EndpointState, info: Any, side: str) -> None:
        """An attempt on `ep` started; side is "prefill" or "decode". Counts it in flight and
        records the prompt in that side's index (decode: always; prefill: with a prefix plugin)."""
        balancer = self.decode if side == DECODE else self.prefill
        if info is not None and (side == DECODE or balancer.inner.use_prefix):
            balancer.inner.approx_match(info)  # info.hashes in this side's prefix args (memoized)
        balancer.dispatched(ep, info)

    def finished(self, ep: EndpointState, side: str, ttft_s: float | None = None,
                 tpot_s: float | None = None, info: Any = None) -> None:
        """The attempt on `ep` ended (`info` as `dispatched` had it)."""
        (self.decode if side == DECODE else self.prefill).finished(ep, ttft_s, tpot_s, info)

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        """The engine reported the prompt size (usage.prompt_tokens)."""
        if info is not None and info.prompt_bytes:
            self._ratio.observe(info.prompt_bytes, prompt_tokens)
        self.decode.observe_prompt_tokens(info, prompt_tokens)
        self.prefill.observe_prompt_tokens(info, prompt_tokens)

    # --- views ---------------------------------------------------------------------------
    def debug_view(self) -> dict[str, Any]:
        """/debug/pd: every PD ModelServer's topology, problem and settings in this worker."""
        state = self._state
        servers = []
        for (ns, name), topo in (state.pd.items() if state is not None else ()):
            s = self.settings.for_server(ns, name)
            servers.append({
                "model_server": f"{ns}/{name}", "connector": topo.connector, "problem": topo.problem,
                "ignored": list(topo.ignored),
                "groups": {g.name: {"prefill": [e.key for e in g.prefill], "decode": [e.key for e in g.decode]}
                           for g in topo.groups.values()},
                "prefill_timeout_s": s.prefill_timeout_s, "min_uncached_tokens": s.min_uncached_tokens,
            })
        index = {side: {key: b.inner.index.endpoint_len(i) for key in sorted(self._live)
                        if (i := b.inner.endpoint_id(key)) is not None and b.inner.index.endpoint_len(i)}
                 for side, b in ((DECODE, self.decode), (PREFILL, self.prefill))}
        return {"servers": servers, "bytes_per_token": self._ratio.bytes_per_token, "index": index,
                "decode_plugins": [p.name for p in self.decode.inner.cfg.scores],
                "prefill_plugins": [p.name for p in self.prefill.inner.cfg.scores],
                "kv_events": {DECODE: side_kv.debug_view(self.decode.inner),
                              PREFILL: side_kv.debug_view(self.prefill.inner)}}

