"""Rate-limit metrics (registered on the router's registry; multiprocess like the others).

Labels are bounded: routes, reasons, Redis addresses; never tenants, users or keys.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from kthena_router.metric_labels import LabelChildren


class RateLimitMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # Kthena's family (dashboards use it): refusals by model, limit type and path.
        self.exceeded = Counter(
            "kthena_router_rate_limit_exceeded_total", "Requests refused by a token rate limit",
            ["model", "limit_type", "path"], registry=registry)
        self.decisions = Counter(
            "kthena_router_ratelimit_decisions_total",
            "Rate-limit admission decisions per route: result admitted|limited|failed_open|failed_closed|"
            "too_long; reason = the refusing dimension and scope (e.g. input_tokens/tenant)",
            ["model_route", "result", "reason"], registry=registry)
        self.charged = Counter(
            "kthena_router_ratelimit_charged_tokens_total",
            "Tokens charged to rate-limit buckets, after settlement with the engines' usage",
            ["model_route", "token_type"], registry=registry)
        self.redis_errors = Counter(
            "kthena_router_ratelimit_redis_errors_total",
            "Failed calls to a rate-limit Redis (each marks it down for redisRetry)",
            ["address"], registry=registry)
        self.child = LabelChildren()  # (family, *labels) -> the cached child

    def decision(self, route: str, result: str, reason: str = "") -> None:
        self.child(self.decisions, route, result, reason).inc()

    def exceeded_for(self, model: str, limit_type: str, path: str) -> None:
        self.child(self.exceeded, model, limit_type, path).inc()

    def redis_error(self, address: str) -> None:
        self.child(self.redis_errors, address).inc()
