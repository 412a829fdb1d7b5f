"""Authentication metrics, registered on the router's registry (multiprocess mode).

Kept next to the code that counts them (as gc_tuning.py and loop_lag.py do); label
children are cached (metric_labels.py). Label
values are bounded: source in {api_key, jwt, none}, result in auth.REASONS + "ok".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from kthena_router.metric_labels import LabelChildren


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.results = Counter(
            "kthena_router_auth_requests_total",
            "Authentication outcomes: source = api_key | jwt | none (no credentials), result = ok or "
            "the refusal reason", ["source", "result"], registry=reg)
        self.keys_reloads = Counter(
            "kthena_router_auth_api_keys_reloads_total",
            "API keys file (re)loads; failure = the file was invalid and the previous keys were kept",
            ["result"], registry=reg)
        self.keys_loaded = Gauge(
            "kthena_router_auth_api_keys", "API keys in the installed keys file",
            multiprocess_mode="livemax", registry=reg)
        self.jwks_fetches = Counter(
            "kthena_router_auth_jwks_fetches_total",
            "JWKS loads: ok, error (unreachable, HTTP error), invalid (no usable key); "
            "after error or invalid the last good keys are kept", ["result"], registry=reg)
        self.jwks_keys = Gauge(
            "kthena_router_auth_jwks_keys", "Verification keys in the current JWKS",
            multiprocess_mode="livemin", registry=reg)
        self._child = LabelChildren()

    def result(self, source: str, result: str) -> None:
        self._child(self.results, source, result).inc()

    def keys_reload(self, ok: bool, count: int | None = None) -> None:
        self.keys_reloads.labels("success" if ok else "failure").inc()
        if count is not None:
            self.keys_loaded.set(count)

    def jwks_fetch(self, result: str, count: int) -> None:
        self.jwks_fetches.labels(result).inc()
        self.jwks_keys.set(count)
