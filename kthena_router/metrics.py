"""Every Prometheus metric of the router (Kthena's names where they exist).

Multiprocess mode: each granian worker writes its values to mmap files in
PROMETHEUS_MULTIPROC_DIR (set by the supervisor before workers start); the admin server
in the parent aggregates them. Gauges therefore name a multiprocess_mode: "livesum" for
in-flight counts, "livemin" for health-like flags (1 only if every live worker agrees).
Label children are cached per label tuple: `.labels()` costs a lock and a dict lookup
per call, too much on the hot path. Label values are bounded (no request ids).

Endpoints that leave the config (pod-IP churn) get their label children pruned
(`prune_endpoints`): the cached child and prometheus_client's own child are dropped, so
a worker's Python objects do not grow with churn. Multiprocess mode limits this:
prometheus_client cannot delete a series from a worker's mmap file (its `remove()` only
drops the in-process child, and warns), so the file keeps one entry per series
(its label text + 16 bytes) and the parent keeps exporting the last value of a gone
endpoint's series until that worker exits (the supervisor's reaper then drops its
live* gauge files). An endpoint that comes back with the same ip:port reuses its entries.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Kthena's buckets for kthena_router_request_duration_seconds.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Scheduling: one Rust call is ~2-20 us; the lower buckets resolve it, the upper ones catch
# long-prompt hashing.
PLUGIN_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
MATCH_RATIO_BUCKETS = (0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)  # Kthena's
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# kthena_router_endpoint_kv_cache_usage: a worker that does not know an endpoint's usage (or
# no longer routes to it) writes this value; the admin server leaves such series out, since
# multiprocess mode cannot delete a series from a worker's file. livemax: any worker that
# knows the value wins over one that does not.
KV_USAGE_METRIC = "kthena_router_endpoint_kv_cache_usage"
KV_UNKNOWN = -1.0


def ensure_multiprocess(prometheus_dir: str) -> None:
    """Switch prometheus_client to multiprocess values if the env var came too late.

    prometheus_client picks its value class from the environment when it is imported;
    the supervisor normally sets the variable before workers start, this covers a worker
    whose settings name a directory the environment did not.
    """
    if not prometheus_dir:
        return
    os.makedirs(prometheus_dir, exist_ok=True)
    if os.environ.get(MULTIPROC_ENV) != prometheus_dir:
        os.environ[MULTIPROC_ENV] = prometheus_dir
    if values.ValueClass is values.MutexValue:
        values.ValueClass = values.MultiProcessValue()


class RouterMetrics:
    """The metric families plus cached children for the hot path."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry = reg
        self.requests = Counter(
            "kthena_router_requests_total", "Requests handled by the router",
            ["model", "path", "status_code", "error_type", "model_route", "model_server", "endpoint"],
            registry=reg)
        self.duration = Histogram(
            "kthena_router_request_duration_seconds", "End-to-end request latency seen by the router",
            ["model", "path", "status_code"], buckets=DURATION_BUCKETS, registry=reg)
        self.tokens = Counter(
            "kthena_router_tokens_total", "Tokens processed (input = prompt, output = completion)",
            ["model", "path", "token_type"], registry=reg)
        self.active_downstream = Gauge(
            "kthena_router_active_downstream_requests", "Client requests in flight",
            ["model"], multiprocess_mode="livesum", registry=reg)
        self.active_upstream = Gauge(
            "kthena_router_active_upstream_requests", "Upstream requests in flight per endpoint",
            ["model_route", "model_server", "endpoint"], multiprocess_mode="livesum", registry=reg)
        self.ttft = Histogram(
            "kthena_router_time_to_first_token_seconds",
            "Time from request arrival to the first response byte sent to the client",
            ["model", "path"], buckets=TTFT_BUCKETS, registry=reg)
        self.tpot = Histogram(
            "kthena_router_time_per_output_token_seconds",
            "(last byte - first byte) / (output tokens - 1) of streamed responses",
            ["model", "path"], buckets=TPOT_BUCKETS, registry=reg)
        self.upstream_errors = Counter(
            "kthena_router_upstream_errors_total", "Failed upstream attempts",
            ["model_server", "endpoint", "reason"], registry=reg)
        self.retries = Counter(
            "kthena_router_retries_total", "Upstream attempts after the first one",
            ["model_server"], registry=reg)
        self.config_reloads = Counter(
            "kthena_router_config_reloads_total", "Config (re)load attempts", ["result"], registry=reg)
        self.config_last_reload_success = Gauge(
            "kthena_router_config_last_reload_success", "1 if the last config (re)load succeeded",
            multiprocess_mode="livemin", registry=reg)
        self.endpoint_healthy = Gauge(
            "kthena_router_endpoint_healthy", "1 if the endpoint is a candidate (not ejected)",
            ["model_server", "endpoint"], multiprocess_mode="livemin", registry=reg)
        # --- scheduling; names and labels as Kthena's where it has them
        self.plugin_duration = Histogram(
            "kthena_router_scheduler_plugin_duration_seconds",
            "Scheduling time per request: plugin=prefix-cache type=match (render + hash + index "
            "lookup), plugin=pipeline type=schedule (every filter/score plugin in one Rust call)",
            ["model", "plugin", "type"], buckets=PLUGIN_BUCKETS, registry=reg)
        self.prefix_match_ratio = Histogram(
            "kthena_router_prefix_cache_match_ratio",
            "Fraction of the prompt's blocks the best-matching candidate endpoint held (0 = miss)",
            ["model"], buckets=MATCH_RATIO_BUCKETS, registry=reg)
        self.decisions = Counter(
            "kthena_router_scheduler_decisions_total", "Requests whose first choice was this endpoint",
            ["model_server", "endpoint"], registry=reg)
        self.kv_fallback = Counter(
            "kthena_router_kvcache_aware_fallback_total",
            "kvcache-aware decisions made with approximate prefix matching (no exact KV events)",
            ["model", "reason"], registry=reg)
        self.metrics_stale = Gauge(
            "kthena_router_endpoint_metrics_stale",
            "1 if the endpoint's last metrics scrape failed or is too old (its load counts as unknown)",
            ["endpoint"], multiprocess_mode="livemax", registry=reg)
        self.hot_spot = Counter(
            "kthena_router_hot_spot_reorders_total",
            "Decisions where the hot-spot guard moved the request off an overloaded endpoint (--hot-spot-abs/-rel)",
            ["model_server"], registry=reg)
        self.index_capacity = Gauge(
            "kthena_router_prefix_index_capacity",
            "Entries the approximate prefix index keeps for the endpoint (largest over workers)",
            ["endpoint"], multiprocess_mode="livemax", registry=reg)
        self.index_bytes_per_token = Gauge(
            "kthena_router_prefix_index_bytes_per_token",
            "Prompt bytes per engine token learned from usage reports; sizes the prefix index",
            multiprocess_mode="livemax", registry=reg)
        self.panics = Counter(
            "kthena_router_panic_routing_total",
            "Requests routed to every endpoint of a server because fewer than "
            "panicThresholdPercent of them were usable (not ejected, not stalled)",
            ["model_server"], registry=reg)
        self.stalled = Counter(
            "kthena_router_stalled_attempts_total",
            "Attempts that waited for their first byte longer than max(stallMinimum, "
            "stallFactor x the endpoint's recent TTFT) (each counts as one failure)",
            ["endpoint"], registry=reg)
        self._children: dict[tuple[Any, ...], Any] = {}
        # changes when children are dropped (prune_endpoints): caches of children start over
        self.generation = 0
        self._families: dict[int, tuple[Any, int]] = {}  # id -> (family, index of its endpoint label or -1)
        # the scheduler's per-request writes go here when set (front/batch.py MetricBatch:
        # merged, written once per loop iteration); else at once
        self.deferred: Any = None

    # --- cached children --------------------------------------------------------------

    def _child(self, family: Any, key: tuple[str, ...]) -> Any:
        cache_key = (id(family), *key)
        child = self._children.get(cache_key)
        if child is None:
            child = self._children[cache_key] = family.labels(*key)
            if id(family) not in self._families:
                names = list(family._labelnames)
                self._families[id(family)] = (family, names.index("endpoint") if "endpoint" in names else -1)
        return child

    def observe_request(self, model: str, path: str, status: int, error_type: str, route: str,
                        server: str, endpoint: str, duration_s: float) -> None:
        code = str(status)
        self._child(self.requests, (model, path, code, error_type, route, server, endpoint)).inc()
        self._child(self.duration, (model, path, code)).observe(duration_s)

    def observe_tokens(self, model: str, path: str, prompt: int | None, completion: int | None) -> None:
        if prompt:
            self._child(self.tokens, (model, path, "input")).inc(prompt)
        if completion:
            self._child(self.tokens, (model, path, "output")).inc(completion)

    def observe_ttft(self, model: str, path: str, seconds: float) -> None:
        self._child(self.ttft, (model, path)).observe(seconds)

    def observe_tpot(self, model: str, path: str, seconds: float) -> None:
        self._child(self.tpot, (model, path)).observe(seconds)

    def downstream(self, model: str) -> Any:
        return self._child(self.active_downstream, (model,))

    def upstream(self, route: str, server: str, endpoint: str) -> Any:
        return self._child(self.active_upstream, (route, server, endpoint))

    def upstream_error(self, server: str, endpoint: str, reason: str) -> None:
        self._child(self.upstream_errors, (server, endpoint, reason)).inc()

    def retry(self, server: str) -> None:
        self._child(self.retries, (server,)).inc()

    def config_reload(self, ok: bool) -> None:
        self._child(self.config_reloads, ("success" if ok else "failure",)).inc()
        self.config_last_reload_success.set(1 if ok else 0)

    def set_endpoint_healthy(self, server: str, endpoint: str, healthy: bool) -> None:
        self._child(self.endpoint_healthy, (server, endpoint)).set(1 if healthy else 0)

    def observe_plugin(self, model: str, plugin: str, kind: str, seconds: float) -> None:
        child = self._child(self.plugin_duration, (model, plugin, kind))
        if self.deferred is not None:
            self.deferred.observe(child, seconds)
        else:
            child.observe(seconds)

    def observe_prefix_ratio(self, model: str, ratio: float) -> None:
        child = self._child(self.prefix_match_ratio, (model,))
        if self.deferred is not None:
            self.deferred.observe(child, ratio)
        else:
            child.observe(ratio)

    def decision(self, server: str, endpoint: str) -> None:
        child = self._child(self.decisions, (server, endpoint))
        if self.deferred is not None:
            self.deferred.add(child, 1)
        else:
            child.inc()

    def kv_fallback_used(self, model: str, reason: str) -> None:
        self._child(self.kv_fallback, (model, reason)).inc()

    def set_metrics_stale(self, endpoint: str, stale: bool) -> None:
        self._child(self.metrics_stale, (endpoint,)).set(1 if stale else 0)

    def hot_spot_reorders(self, server: str, n: int) -> None:
        self._child(self.hot_spot, (server,)).inc(n)

    def set_index_sizing(self, bytes_per_token: float, capacities: dict[str, int]) -> None:
        self.index_bytes_per_token.set(bytes_per_token)
        for endpoint, cap in capacities.items():
            self._child(self.index_capacity, (endpoint,)).set(cap)

    def panic(self, server: str) -> None:
        self._child(self.panics, (server,)).inc()

    def stalled_attempts(self, endpoint: str, n: int) -> None:
        self._child(self.stalled, (endpoint,)).inc(n)

    def prune_endpoints(self, endpoints: set[str]) -> None:
        """Drop every label child whose `endpoint` label is one of `endpoints` (gone from
        the config); see the module docstring for multiprocess mode."""
        self.generation += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # multiprocess: in-process removal only
            for key in list(self._children):
                fam = self._families[key[0]]
                pos = fam[1]
                if pos >= 0 and key[1 + pos] in endpoints:
                    if fam[0]._name == KV_USAGE_METRIC:  # the file keeps the last value: mark it unknown
                        self._children[key].set(KV_UNKNOWN)
                    fam[0].remove(*key[1:])
                    del self._children[key]

    # --- kvcache-aware event streams (kept last: metrics.py is edited concurrently)
    def set_kv_stream_up(self, endpoint: str, up: bool) -> None:
        """kthena_router_kv_events_stream_up{endpoint}: 1 while every live worker's KV-event
        subscription to the endpoint is up (livemin), created on first use."""
        gauge = self.__dict__.get("kv_stream_up")
        if gauge is None:
            gauge = self.kv_stream_up = Gauge(
                "kthena_router_kv_events_stream_up",
                "1 if the router's KV-event subscription to the endpoint is up (kvcache-aware)",
                ["endpoint"], multiprocess_mode="livemin", registry=self.registry)
        self._child(gauge, (endpoint,)).set(1 if up else 0)

    # --- session stickiness (kthena_router.session), created on first use
    def session_sticky(self, route: str, result: str) -> None:
        """kthena_router_session_sticky_total{model_route,result}: requests of routes with
        sessionSticky, by outcome: hit (served by the pinned endpoint), miss (a new key,
        pinned now), moved (the pinned endpoint was not a usable candidate: pinned anew),
        no_key (no source gave a key), unavailable (the store failed: scheduled without)."""
        family = self.__dict__.get("sticky")
        if family is None:
            family = self.sticky = Counter(
                "kthena_router_session_sticky_total",
                "Requests of sessionSticky routes by outcome (hit, miss, moved, no_key, unavailable)",
                ["model_route", "result"], registry=self.registry)
        self._child(family, (route, result)).inc()

    def session_store_error(self, backend: str, op: str) -> None:
        """kthena_router_session_sticky_store_errors_total{backend,op}: failed store calls."""
        family = self.__dict__.get("sticky_store_errors")
        if family is None:
            family = self.sticky_store_errors = Counter(
                "kthena_router_session_sticky_store_errors_total",
                "Session-affinity store calls that failed (the request was scheduled without affinity)",
                ["backend", "op"], registry=self.registry)
        self._child(family, (backend, op)).inc()

    # --- the autoscaler's router signals (docs/autoscaler.md "router:" metrics), kept last
    def _signal_families(self) -> tuple[Any, Any]:
        fams = self.__dict__.get("_signals")
        if fams is None:
            fams = self._signals = (
                Counter("kthena_router_endpoint_tokens_total",
                        "Tokens per endpoint from the engines' usage (input = prompt, output = completion; "
                        "prefill/decode: input at the prefill endpoint, output at the decode endpoint)",
                        ["model_server", "endpoint", "token_type"], registry=self.registry),
                Gauge(KV_USAGE_METRIC,
                      "KV-cache usage (0..1) of the endpoint from the router's own engine scrape "
                      "(largest over workers; absent when unknown)",
                      ["model_server", "endpoint"], multiprocess_mode="livemax", registry=self.registry))
        return fams

    def observe_endpoint_tokens(self, server: str, endpoint: str, input_endpoint: str,
                                prompt: int | None, completion: int | None) -> None:
        """kthena_router_endpoint_tokens_total; `input_endpoint` is where the prompt was
        computed when it is not `endpoint` (the prefill hop of a PD pair), else ""."""
        if not endpoint:
            return
        fam = self._signal_families()[0]
        if prompt:
            self._child(fam, (server, input_endpoint or endpoint, "input")).inc(prompt)
        if completion:
            self._child(fam, (server, endpoint, "output")).inc(completion)

    def set_kv_usage(self, server: str, endpoint: str, usage: float | None) -> None:
        """kthena_router_endpoint_kv_cache_usage; None (unknown) writes the sentinel the
        admin server leaves out (a multiprocess series cannot be deleted)."""
        self._child(self._signal_families()[1], (server, endpoint)).set(KV_UNKNOWN if usage is None else usage)

    def pending(self, model: str, server: str) -> Any:
        """kthena_router_pending_requests{model,model_server}: requests held while the
        ModelServer has no endpoint (scale from zero), summed over live workers."""
        fam = self.__dict__.get("pending_requests")
        if fam is None:
            fam = self.pending_requests = Gauge(
                "kthena_router_pending_requests",
                "Requests held because the ModelServer has zero endpoints (waiting for a scale from zero)",
                ["model", "model_server"], multiprocess_mode="livesum", registry=self.registry)
        return self._child(fam, (model, server))
