"""Round-robin candidate lists among healthy endpoints."""

from __future__ import annotations

from collections import Counter

from kthena_router.endpoints.balancer import RoundRobinBalancer
from kthena_router.endpoints.health import EndpointHealth, Failure


class _Ep:
    def __init__(self, name: str) -> None:
        self.name = name
        self.health = EndpointHealth()

    def __repr__(self) -> str:
        return self.name


def test_rotation_covers_every_endpoint_evenly() -> None:
    eps = [_Ep(n) for n in "abc"]
    rr = RoundRobinBalancer()
    firsts = Counter(rr.candidates("k", eps)[0].name for _ in range(300))
    assert firsts == {"a": 100, "b": 100, "c": 100}


def test_candidate_list_is_a_rotation_of_all_healthy() -> None:
    eps = [_Ep(n) for n in "abcd"]
    rr = RoundRobinBalancer()
    for _ in range(5):
        cands = rr.candidates("k", eps)
        assert sorted(c.name for c in cands) == ["a", "b", "c", "d"]
        i = eps.index(cands[0])
        assert cands == eps[i:] + eps[:i]


def test_ejected_endpoints_are_left_out() -> None:
    eps = [_Ep(n) for n in "abc"]
    eps[1].health.record_failure(Failure.CONNECT, now=0.0)
    rr = RoundRobinBalancer()
    seen = {c.name for _ in range(6) for c in rr.candidates("k", eps)}
    assert seen == {"a", "c"}


def test_no_healthy_endpoint_gives_empty_list() -> None:
    eps = [_Ep("a")]
    eps[0].health.record_failure(Failure.TIMEOUT, now=0.0)
    assert RoundRobinBalancer().candidates("k", eps) == []


def test_counters_are_per_key() -> None:
    eps = [_Ep(n) for n in "ab"]
    rr = RoundRobinBalancer()
    assert rr.candidates("x", eps)[0].name == "a"
    assert rr.candidates("y", eps)[0].name == "a"
    assert rr.candidates("x", eps)[0].name == "b"
