"""RouteTable: model lookup, rule predicates, conflict order, LoRA, weighted split."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from config_fixtures import endpoints, load, route, server
from starlette.datastructures import Headers

from kthena_router.routing import RouteNotFound, RouteTable

PATH = "/v1/chat/completions"


def table(tmp_path, docs) -> RouteTable:
    return RouteTable.build(load(tmp_path, docs))


def rule(target: str = "s", **match) -> dict:
    r: dict = {"targetModels": [{"modelServerName": target}]}
    if match:
        r["modelMatch"] = match
    return r


def servers(*names: str) -> list[dict]:
    return [server(n, f"up-{n}") for n in names] + [endpoints(eps=[
        {"address": "127.0.0.1", "port": 9000 + i, "labels": {"app": n}} for i, n in enumerate(names)])]


def test_model_name_rewrite_and_unknown_model(tmp_path):
    t = table(tmp_path, [route("r", "m")] + servers("s"))
    m = t.match("m", PATH, {}, random.Random(0))
    assert (m.route.name, m.server.name, m.upstream_model, m.is_lora) == ("r", "s", "up-s", False)
    with pytest.raises(RouteNotFound) as ei:
        t.match("other", PATH, {}, random.Random(0))
    assert ei.value.code == "model_not_found" and ei.value.status == 404 and "other" in ei.value.message


def test_server_without_model_keeps_route_model_name(tmp_path):
    t = table(tmp_path, [route("r", "public"), server("s", None), endpoints()])
    assert t.match("public", PATH, {}, random.Random(0)).upstream_model == "public"


def test_lora_keeps_adapter_name(tmp_path):
    t = table(tmp_path, [route("r", "base", lora=["ad-1", "ad-2"])] + servers("s"))
    m = t.match("ad-2", PATH, {}, random.Random(0))
    assert (m.upstream_model, m.is_lora, m.server.name) == ("ad-2", True, "s")
    assert t.match("base", PATH, {}, random.Random(0)).is_lora is False


def test_model_name_wins_over_lora_adapter_of_another_route(tmp_path):
    docs = [route("adapters", None, lora=["x"], rules=[rule("a")]), route("named", "x", rules=[rule("b")])]
    t = table(tmp_path, docs + servers("a", "b"))
    m = t.match("x", PATH, {}, random.Random(0))
    assert (m.route.name, m.is_lora, m.upstream_model) == ("named", False, "up-b")
    assert t.model_names() == [("x", False)]


def test_model_names_lists_models_then_adapters_in_file_order(tmp_path):
    docs = [route("r1", "b", lora=["l1"]), route("r2", "a", lora=["l2", "l1"]), route("r3", None, lora=["l3"])]
    t = table(tmp_path, docs + servers("s"))
    assert t.model_names() == [("b", False), ("a", False), ("l1", True), ("l2", True), ("l3", True)]


def test_header_rules(tmp_path):
    rules = [
        rule("a", headers={"X-Tier": {"exact": "beta"}}),
        rule("b", headers={"x-user": {"prefix": "team-"}}),
        rule("c", headers={"x-region": {"regex": "^eu-(west|north)$"}}),
        rule("d"),
    ]
    t = table(tmp_path, [route("r", "m", rules=rules)] + servers("a", "b", "c", "d"))
    rng = random.Random(0)

    def pick(h):
        return t.match("m", PATH, h, rng).server.name

    assert pick({"x-tier": "beta"}) == "a"
    assert pick(Headers({"X-TIER": "beta"})) == "a"  # case-insensitive mapping from starlette
    assert pick({"x-tier": "beta2", "x-user": "team-x"}) == "b"
    assert pick({"x-user": "xteam-"}) == "d"
    assert pick({"x-region": "eu-west"}) == "c"
    assert pick({"x-region": "eu-west-1"}) == "d"
    assert pick({}) == "d"


def test_regex_is_unanchored_search_like_go(tmp_path):
    t = table(tmp_path, [route("r", "m", rules=[rule("a", headers={"x": {"regex": "beta"}}), rule("b")])]
              + servers("a", "b"))
    assert t.match("m", PATH, {"x": "is-beta-user"}, random.Random(0)).server.name == "a"


def test_missing_header_matches_as_empty_string_like_kthena(tmp_path):
    t = table(tmp_path, [route("r", "m", rules=[rule("a", headers={"x": {"exact": ""}}), rule("b")])]
              + servers("a", "b"))
    assert t.match("m", PATH, {}, random.Random(0)).server.name == "a"
    assert t.match("m", PATH, {"x": "v"}, random.Random(0)).server.name == "b"


def test_uri_and_body_model_and_all_conditions(tmp_path):
    rules = [
        rule("a", uri={"exact": "/v1/completions"}, headers={"x": {"exact": "1"}}),
        rule("b", uri={"prefix": "/v1/completions"}),
        rule("c", body={"model": "lora-1"}),
        rule("d", uri={"prefix": "/v1/chat"}),
    ]
    t = table(tmp_path, [route("r", "m", lora=["lora-1"], rules=rules)] + servers("a", "b", "c", "d"))
    rng = random.Random(0)
    assert t.match("m", "/v1/completions", {"x": "1"}, rng).server.name == "a"
    assert t.match("m", "/v1/completions", {"x": "2"}, rng).server.name == "b"  # all conditions must hold
    assert t.match("lora-1", PATH, {}, rng).server.name == "c"
    assert t.match("m", PATH, {}, rng).server.name == "d"
    with pytest.raises(RouteNotFound) as ei:
        t.match("m", "/v1/embeddings", {}, rng)
    assert ei.value.code == "model_not_found" and "No route rule matches" in ei.value.message


def test_conflict_oldest_timestamp_wins_then_namespace_name(tmp_path):
    docs = [
        route("z-new", "m", ts="2025-06-01T00:00:00Z", rules=[rule("a")]),
        route("no-ts", "m", rules=[rule("d")]),
        route("b-old", "m", ts="2024-01-01T00:00:00Z", rules=[rule("b")]),
        route("a-old", "m", ts="2024-01-01T00:00:00Z", rules=[rule("c")]),
    ]
    t = table(tmp_path, docs + servers("a", "b", "c", "d"))
    assert t.match("m", PATH, {}, random.Random(0)).route.name == "a-old"


def test_conflict_without_timestamps_is_file_order(tmp_path):
    docs = [route("second-by-name", "m", rules=[rule("a")]), route("a-first-by-name", "m", rules=[rule("b")])]
    t = table(tmp_path, docs + servers("a", "b"))
    assert t.match("m", PATH, {}, random.Random(0)).route.name == "second-by-name"


def test_timestamped_routes_rank_before_untimestamped(tmp_path):
    docs = [route("first-in-file", "m", rules=[rule("a")]),
            route("dated", "m", ts="2030-01-01T00:00:00Z", rules=[rule("b")])]
    t = table(tmp_path, docs + servers("a", "b"))
    assert t.match("m", PATH, {}, random.Random(0)).route.name == "dated"


def test_lower_priority_route_serves_what_the_winner_leaves_unmatched(tmp_path):
    docs = [route("winner", "m", rules=[rule("a", headers={"x": {"exact": "1"}})]),
            route("fallback", "m", rules=[rule("b")])]
    t = table(tmp_path, docs + servers("a", "b"))
    assert t.match("m", PATH, {"x": "1"}, random.Random(0)).route.name == "winner"
    assert t.match("m", PATH, {}, random.Random(0)).route.name == "fallback"


# ---------------------------------------------------------------- weighted split statistics

# Chi-square with k-1 = 2 degrees of freedom has survival exp(-x/2): P(X > 27.63) = 1e-6.
CHI2_DF2_1E6 = -2 * math.log(1e-6)
N = 20_000


def chi2(counts: Counter, expected: dict[str, float]) -> float:
    return sum((counts[k] - e) ** 2 / e for k, e in expected.items())


def test_weighted_split_follows_weights(tmp_path):
    targets = [{"modelServerName": n, "weight": w} for n, w in (("a", 50), ("b", 30), ("z", 0), ("c", 20))]
    t = table(tmp_path, [route("r", "m", rules=[{"targetModels": targets}])] + servers("a", "b", "c", "z"))
    rng = random.Random(1234)
    counts = Counter(t.match("m", PATH, {}, rng).server.name for _ in range(N))
    assert counts["z"] == 0  # weight 0 is never chosen
    assert chi2(counts, {"a": 0.5 * N, "b": 0.3 * N, "c": 0.2 * N}) < CHI2_DF2_1E6, counts


def test_weights_need_not_sum_to_100(tmp_path):
    targets = [{"modelServerName": "a", "weight": 1}, {"modelServerName": "b", "weight": 3}]
    t = table(tmp_path, [route("r", "m", rules=[{"targetModels": targets}])] + servers("a", "b"))
    rng = random.Random(99)
    a = sum(t.match("m", PATH, {}, rng).server.name == "a" for _ in range(N))
    sd = math.sqrt(N * 0.25 * 0.75)
    assert abs(a - 0.25 * N) < 4.9 * sd  # two-sided binomial bound, false failure ~1e-6


def test_unweighted_targets_split_evenly(tmp_path):
    targets = [{"modelServerName": n} for n in ("a", "b", "c")]
    t = table(tmp_path, [route("r", "m", rules=[{"targetModels": targets}])] + servers("a", "b", "c"))
    rng = random.Random(7)
    counts = Counter(t.match("m", PATH, {}, rng).server.name for _ in range(N))
    assert chi2(counts, {k: N / 3 for k in "abc"}) < CHI2_DF2_1E6, counts


def test_split_uses_the_rng_passed_in(tmp_path):
    targets = [{"modelServerName": "a", "weight": 50}, {"modelServerName": "b", "weight": 50}]
    t = table(tmp_path, [route("r", "m", rules=[{"targetModels": targets}])] + servers("a", "b"))

    def seq(seed):
        rng = random.Random(seed)
        return [t.match("m", PATH, {}, rng).server.name for _ in range(64)]

    assert seq(5) == seq(5)
    assert seq(5) != seq(6)


def test_single_target_does_not_draw(tmp_path):
    t = table(tmp_path, [route("r", "m")] + servers("s"))
    rng = random.Random(3)
    state = rng.getstate()
    t.match("m", PATH, {}, rng)
    assert rng.getstate() == state
