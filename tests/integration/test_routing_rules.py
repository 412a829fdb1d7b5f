"""Route rules end to end: weighted (canary) split, header and URI rules, through the router.

Two ModelServers over one simulator: `srv-a` owns engine 0, `srv-b` engines 1 and 2.
Which server served a request is read from the engines' own request logs (by request id),
so the router's choice is checked where it lands, not where the router says it sent it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import harness

N_SPLIT = 300
WEIGHT_A = 20  # percent of the canary split that goes to srv-a


def _docs(ports: list[int]) -> list[dict]:
    a, b = {"app": "srv-a"}, {"app": "srv-b"}
    rules = [
        {"name": "gold", "modelMatch": {"headers": {"x-tenant": {"exact": "gold"}}},
         "targetModels": [{"modelServerName": "srv-a"}]},
        {"name": "team-prefix", "modelMatch": {"headers": {"x-team": {"prefix": "ml-"}}},
         "targetModels": [{"modelServerName": "srv-b"}]},
        {"name": "user-regex", "modelMatch": {"headers": {"x-user": {"regex": "^u[0-9]+$"}}},
         "targetModels": [{"modelServerName": "srv-a"}]},
        {"name": "completions-uri", "modelMatch": {"uri": {"prefix": "/v1/completions"}},
         "targetModels": [{"modelServerName": "srv-b"}]},
        {"name": "canary", "targetModels": [{"modelServerName": "srv-a", "weight": WEIGHT_A},
                                            {"modelServerName": "srv-b", "weight": 100 - WEIGHT_A}]},
    ]
    return [
        harness.route_doc("split", "demo", "", rules=rules),
        harness.server_doc("srv-a", "demo", a),
        harness.server_doc("srv-b", "demo", b),
        harness.endpoints_doc("eng-a", ports[:1], a),
        harness.endpoints_doc("eng-b", ports[1:], b),
    ]


@pytest.fixture
def rules_router(router_workers: int, simulator: harness.Simulator, tmp_path: Path) -> Iterator[harness.Router]:
    cfg = harness.write_config(tmp_path / "rules.yaml", _docs(simulator.ports))
    with harness.start_router(cfg, tmp_path, workers=router_workers, extra_args=["--route-seed", "7"]) as router:
        yield router


def _send(router: harness.Router, ids: list[str], headers: dict[str, str] | None = None,
          path: str = "/v1/chat/completions") -> None:
    body: dict = {"model": "demo", "max_tokens": 1}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    with httpx.Client(base_url=router.base_url, timeout=60) as client:
        for rid in ids:
            r = client.post(path, json=body, headers={"x-request-id": rid, **(headers or {})})
            assert r.status_code == 200, r.text


def _served_by_a(sim: harness.Simulator, ids: list[str]) -> list[bool]:
    """For each id (in order): True if engine 0 (srv-a) served it, False if srv-b did."""
    where: dict[str, bool] = {}
    for engine in range(3):
        for entry in sim.requests(engine)["log"]:
            rid = entry["request_id"]
            assert rid not in where, f"{rid} reached two engines"
            where[rid] = engine == 0
    missing = [rid for rid in ids if rid not in where]
    assert not missing, f"requests no engine saw: {missing[:5]}"
    return [where[rid] for rid in ids]


def test_weighted_split_within_strict_binomial_bound(rules_router: harness.Router,
                                                     simulator: harness.Simulator) -> None:
    ids = [f"split-{i}" for i in range(N_SPLIT)]
    _send(rules_router, ids)
    hits_a = sum(_served_by_a(simulator, ids))
    # Binomial(N, p): a deviation beyond 5 sigma has probability < 6e-7 (normal tail),
    # so this fails for a wrong split (e.g. 50/50 or inverted), not by chance.
    p = WEIGHT_A / 100
    mean, sd = N_SPLIT * p, math.sqrt(N_SPLIT * p * (1 - p))
    assert abs(hits_a - mean) <= 5 * sd, (hits_a, mean, sd)


def test_seeded_split_is_reproducible(simulator: harness.Simulator, tmp_path: Path) -> None:
    # One worker: with several, the kernel spreads connections over workers, each drawing
    # from its own generator, so only the statistical bound above holds.
    cfg = harness.write_config(tmp_path / "rules.yaml", _docs(simulator.ports))
    runs = []
    for run in range(2):
        simulator.reset_requests()
        router = harness.start_router(cfg, tmp_path / f"run{run}", extra_args=["--route-seed", "11"])
        try:
            ids = [f"seed{run}-{i}" for i in range(60)]
            _send(router, ids)
            runs.append(_served_by_a(simulator, ids))
        finally:
            router.stop()
    assert runs[0] == runs[1]
    assert 0 < sum(runs[0]) < len(runs[0])  # both targets drawn: the seed did not pin one


@pytest.mark.parametrize(
    ("headers", "path", "to_a"),
    [
        ({"x-tenant": "gold"}, "/v1/chat/completions", True),
        ({"X-Tenant": "gold", "x-team": "ml-infra"}, "/v1/chat/completions", True),  # first rule wins
        ({"x-team": "ml-infra"}, "/v1/chat/completions", False),
        ({"x-user": "u42"}, "/v1/chat/completions", True),
        ({"x-tenant": "gold"}, "/v1/completions", True),  # header rule comes before the uri rule
        ({}, "/v1/completions", False),
    ],
)
def test_header_and_uri_rules(rules_router: harness.Router, simulator: harness.Simulator,
                              headers: dict[str, str], path: str, to_a: bool) -> None:
    ids = [f"rule-{i}" for i in range(8)]
    _send(rules_router, ids, headers, path)
    assert _served_by_a(simulator, ids) == [to_a] * len(ids)


def test_header_rule_misses_fall_through_to_canary(rules_router: harness.Router,
                                                   simulator: harness.Simulator) -> None:
    # "x-user: admin" fails the regex, "x-team: ai-ml" fails the prefix: the canary split applies,
    # so over enough requests both servers are seen.
    ids = [f"miss-{i}" for i in range(60)]
    _send(rules_router, ids, {"x-user": "admin", "x-team": "ai-ml"})
    served = _served_by_a(simulator, ids)
    assert any(served) and not all(served)
