"""Round-robin candidate lists among usable endpoints; panic threshold; stalled endpoints."""

from __future__ import annotations

import time
from collections import Counter

from kthena_router.config.traffic import OutlierDetection, ServerTraffic, TrafficSettings
from kthena_router.endpoints.balancer import RoundRobinBalancer
from kthena_router.endpoints.health import EndpointHealth
from kthena_router.endpoints.selection import EndpointSelector


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
    eps[1].health.eject(now=time.monotonic())
    rr = RoundRobinBalancer()
    seen = {c.name for _ in range(6) for c in rr.candidates("k", eps)}
    assert seen == {"a", "c"}


def _selector(panic_pct: float, panics: list) -> EndpointSelector:
    od = OutlierDetection(panic_threshold_percent=panic_pct)
    return EndpointSelector(TrafficSettings(defaults=ServerTraffic(outlier=od)),
                            on_panic=lambda key, eps: panics.append((key, len(eps))))


def test_panic_routes_to_every_endpoint_when_too_few_are_usable() -> None:
    eps = [_Ep(n) for n in "abcd"]
    panics: list = []
    rr = RoundRobinBalancer(_selector(50.0, panics))
    now = time.monotonic()
    eps[0].health.eject(now)
    eps[1].health.eject(now)  # 2 of 4 usable: 50% is not below the threshold
    assert {c.name for c in rr.candidates(("ns", "s"), eps)} == {"c", "d"} and not panics
    eps[2].health.eject(now)  # 1 of 4: panic, everyone is a candidate again
    assert sorted(c.name for c in rr.candidates(("ns", "s"), eps)) == ["a", "b", "c", "d"]
    assert panics == [(("ns", "s"), 4)]


def test_panic_threshold_zero_keeps_the_503() -> None:
    eps = [_Ep("a")]
    eps[0].health.eject(time.monotonic())
    panics: list = []
    assert RoundRobinBalancer(_selector(0.0, panics)).candidates("k", eps) == [] and not panics


def test_stalled_endpoint_stops_attracting_traffic() -> None:
    eps = [_Ep(n) for n in "ab"]
    rr = RoundRobinBalancer()
    stall_min = eps[0].health.policy.stall_min_s
    pending = eps[0].health.begin(now=time.monotonic() - 2 * stall_min)  # sent long ago, no byte since
    seen = {c.name for _ in range(4) for c in rr.candidates("k", eps)}
    assert seen == {"b"}
    assert eps[0].health.healthy  # left out for no progress, not (yet) ejected
    eps[0].health.first_byte(pending)  # it answered after all: progress, a candidate again
    assert {c.name for _ in range(4) for c in rr.candidates("k", eps)} == {"a", "b"}


def test_counters_are_per_key() -> None:
    eps = [_Ep(n) for n in "ab"]
    rr = RoundRobinBalancer()
    assert rr.candidates("x", eps)[0].name == "a"
    assert rr.candidates("y", eps)[0].name == "a"
    assert rr.candidates("x", eps)[0].name == "b"
