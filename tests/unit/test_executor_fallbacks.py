"""Explicit retries beyond the ranked candidates go to endpoints not yet tried (executor)."""

from __future__ import annotations

import time

from kthena_router.endpoints.health import EndpointHealth
from kthena_router.endpoints.registry import EndpointState
from kthena_router.proxy.executor import _next_candidate, with_fallbacks


def _eps(n: int) -> tuple[EndpointState, ...]:
    return tuple(EndpointState(f"127.0.0.1:{9000 + i}", "127.0.0.1", 9000 + i, "127.0.0.1", "http", None,
                               EndpointHealth(), {}, "default/demo") for i in range(n))


def test_fallbacks_follow_the_ranked_candidates_and_skip_unusable_ones() -> None:
    a, b, c = _eps(3)
    c.health.eject(time.monotonic())
    out = with_fallbacks([b], (a, b, c))
    assert out == [b, a]  # ranked first, then the usable rest; the ejected one is left out


def test_a_retry_after_the_only_ranked_candidate_reaches_another_endpoint() -> None:
    a, b = _eps(2)
    ranked = [a]  # e.g. least-request's filter kept only the (failing) endpoint a
    plain = [ep.key for ep in (_next_candidate(ranked, 0), _next_candidate(ranked, 1))]
    assert plain == [a.key, a.key]  # without fallbacks the retry goes back to a
    full = with_fallbacks(ranked, (a, b))
    tried = [_next_candidate(full, 0), _next_candidate(full, 1)]
    assert [ep.key for ep in tried if ep] == [a.key, b.key]
