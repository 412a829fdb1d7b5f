"""The scheduler glue (Python side of the pipeline): ids, index ownership at dispatch,
snapshots -> Rust scorer, LoRA interning, health, purging, kvcache-aware hook/fallback."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry

from kthena_router.endpoints.health import EndpointHealth
from kthena_router.endpoints.registry import EndpointState
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.scheduling.request import RequestInfo
from kthena_router.scheduling.scheduler import Scheduler

KEY = ("default", "demo")
SYSTEM = "You are a helpful assistant. " * 40


def sched(yaml_text: str) -> tuple[Scheduler, RouterMetrics]:
    cfg = load_router_configuration_bytes(yaml_text.encode(), source="t.yaml").scheduler
    m = RouterMetrics(CollectorRegistry())
    return Scheduler(cfg, m), m


def cfg(*scores: str, filters: str = "") -> str:
    f = f"    Filter: {{enabled: [{filters}]}}\n" if filters else ""
    body = "".join(f"      - {{name: {s}, weight: 1}}\n" for s in scores)
    return f"scheduler:\n  plugins:\n{f}    Score:\n      enabled:\n{body}"


def endpoints(n: int) -> tuple[EndpointState, ...]:
    return tuple(EndpointState(f"127.0.0.1:{9000 + i}", "127.0.0.1", 9000 + i, "127.0.0.1", "http", None,
                               EndpointHealth(), {}, "default/demo") for i in range(n))


def snap(ep: EndpointState, running: int = 0, waiting: int = 0, *, stale: bool = False,
         loras: tuple[str, ...] | None = None, max_lora: int | None = None,
         blocks: int | None = None) -> EndpointSnapshot:
    return EndpointSnapshot(ep.key, "vllm", 1.0, 1.0, stale, 1 if stale else 0, None, last_running=running,
                            last_waiting=waiting, last_kv_usage=0.1, last_loaded_loras=loras,
                            last_max_lora=max_lora, num_gpu_blocks=blocks, block_size=16 if blocks else None)


def chat(rid: str, question: str, model: str = "demo", lora: str = "") -> RequestInfo:
    body = {"model": lora or model, "messages": [{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": question}]}
    return RequestInfo(rid, "/v1/chat/completions", body, model, lora, lora or model)


def fresh(s: Scheduler, eps: tuple[EndpointState, ...]) -> None:
    s.sync({KEY: eps})
    for ep in eps:
        s.on_snapshot(snap(ep))


def owned_prefix(s: Scheduler) -> tuple[tuple[EndpointState, ...], EndpointState]:
    """Three busy engines (one more request is a small relative difference); request r1 was
    dispatched to the first choice, which now holds the shared system prompt."""
    eps = endpoints(3)
    s.sync({KEY: eps})
    for ep in eps:
        s.on_snapshot(snap(ep, running=10))
    info = chat("r1", "q1")
    first = s.candidates(KEY, eps, info)[0]
    s.dispatched(first, info)
    return eps, first


def test_ownership_is_recorded_at_dispatch_not_at_completion():
    s, m = sched(cfg("prefix-cache", "least-request"))
    eps, first = owned_prefix(s)  # r1 still running: a request sharing its system prompt follows
    for i in range(10):
        assert s.candidates(KEY, eps, chat(f"r2-{i}", "another question"))[0] is first
    ratios = [x for x in m.prefix_match_ratio.collect()[0].samples if x.name.endswith("_sum")]
    assert ratios and ratios[0].value > 5  # 10 near-full matches after one miss


def test_misses_spread_by_request_id_not_prompt():
    s, _ = sched(cfg("prefix-cache", "least-request"))
    eps = endpoints(4)
    fresh(s, eps)
    firsts = Counter(s.candidates(KEY, eps, chat(f"req-{i}", "same question"))[0].key for i in range(200))
    assert len(firsts) == 4 and min(firsts.values()) > 20, firsts


def test_candidates_are_an_ordering_of_the_healthy_endpoints():
    s, m = sched(cfg("least-request"))
    eps = endpoints(3)
    fresh(s, eps)
    eps[1].health.healthy = False
    out = s.candidates(KEY, eps, chat("r", "q"))
    assert sorted(e.key for e in out) == sorted([eps[0].key, eps[2].key])
    decisions = {smp.labels["endpoint"]: smp.value for smp in m.decisions.collect()[0].samples
                 if smp.name.endswith("_total")}
    assert decisions == {out[0].key: 1.0}


def test_stale_endpoint_is_not_idle_and_in_flight_reacts_at_once():
    s, _ = sched(cfg("least-request"))
    eps = endpoints(2)
    s.sync({KEY: eps})
    s.on_snapshot(snap(eps[0], running=8))
    s.on_snapshot(snap(eps[1], running=0))
    assert s.candidates(KEY, eps, chat("a", "q"))[0] is eps[1]
    s.on_snapshot(snap(eps[1], stale=True))  # its scrape failed: unknown, not zero
    assert s.candidates(KEY, eps, chat("b", "q"))[0] is eps[0]
    s.on_snapshot(snap(eps[1], running=0))
    for i in range(10):  # our own dispatches count before the next scrape
        s.dispatched(eps[1], None)
    assert s.candidates(KEY, eps, chat("c", "q"))[0] is eps[0]
    for i in range(10):
        s.finished(eps[1], ttft_s=0.01, tpot_s=0.001)
    assert s.candidates(KEY, eps, chat("d", "q"))[0] is eps[1]


def test_lora_requests_go_to_endpoints_with_the_adapter():
    s, _ = sched(cfg("least-request", "lora-affinity", filters="lora-affinity"))
    eps = endpoints(3)
    s.sync({KEY: eps})
    s.on_snapshot(snap(eps[0], loras=(), max_lora=1))
    s.on_snapshot(snap(eps[1], loras=("ad",), max_lora=1))
    s.on_snapshot(snap(eps[2], loras=("other",), max_lora=1))
    for i in range(20):
        assert s.candidates(KEY, eps, chat(f"r{i}", "q", lora="ad"))[0] is eps[1]
    # an adapter nobody has: only endpoints with room to load it
    assert {s.candidates(KEY, eps, chat(f"x{i}", "q", lora="new"))[0].key for i in range(20)} == {eps[0].key}


def test_lora_requests_join_their_adapters_batch_while_it_has_room():
    # every engine registers all four adapters (/v1/models) but batches at most two at once
    s, _ = sched(cfg("lora-affinity"))
    eps = endpoints(3)
    s.sync({KEY: eps})
    for ep in eps:
        s.on_snapshot(snap(ep, loras=("a", "b", "c", "d"), max_lora=2))
    a, b, c = (chat(f"{n}0", "q", lora=n) for n in "abc")
    s.dispatched(eps[1], a)
    for i in range(10):  # where "a" runs
        assert s.candidates(KEY, eps, chat(f"a{i}", "q", lora="a"))[0] is eps[1]
    s.dispatched(eps[0], b)
    s.dispatched(eps[0], c)  # eps[0]'s batch is full of other adapters
    for i in range(10):
        assert s.candidates(KEY, eps, chat(f"d{i}", "q", lora="d"))[0] is not eps[0]
    s.finished(eps[1], info=a)  # "a" drained: every engine with a free slot is equal again
    s.finished(eps[0], info=b)
    assert {s.candidates(KEY, eps, chat(f"a{i}", "q", lora="a"))[0].key for i in range(40)} == {e.key for e in eps}
    view = s.debug_view()["servers"]
    assert [e["lora_in_flight"] for e in next(iter(view.values())).values()] == [{"c": 1}, {}, {}]


def test_a_sibling_workers_adapters_fill_the_batch_through_the_relay():
    # two workers of one pod: what A's flight listener emits reaches B as the hub relays it
    (a, _), (b, _) = sched(cfg("lora-affinity")), sched(cfg("lora-affinity"))
    eps = endpoints(2)
    for s in (a, b):
        s.sync({KEY: eps})
        for ep in eps:
            s.on_snapshot(snap(ep, loras=("x", "y", "z"), max_lora=2))
    sent: list[tuple[str, int, str]] = []
    a.flight_listener = lambda key, delta, lora: sent.append((key, delta, lora))
    x, y = chat("x0", "q", lora="x"), chat("y0", "q", lora="y")
    a.dispatched(eps[0], x)
    a.dispatched(eps[0], y)  # eps[0]'s batch is full, but only A has seen it
    for key, delta, lora in sent:
        b.remote_in_flight(key, delta, lora)
    for i in range(10):
        assert b.candidates(KEY, eps, chat(f"z{i}", "q", lora="z"))[0] is eps[1]
    ep0 = next(iter(b.debug_view()["servers"].values()))[eps[0].key]
    assert (ep0["lora_in_flight"], ep0["lora_remote"]) == ({}, {"x": 1, "y": 1})
    sent.clear()
    a.finished(eps[0], info=x)
    a.finished(eps[0], info=y)
    for key, delta, lora in sent:
        b.remote_in_flight(key, delta, lora)
    assert next(iter(b.debug_view()["servers"].values()))[eps[0].key]["lora_remote"] == {}
    a.dispatched(eps[0], x)  # a completion the relay loses is dropped once the engine stops listing it
    b.remote_in_flight(eps[0].key, 1, "x")
    b.on_snapshot(EndpointSnapshot(eps[0].key, "vllm", 1.0, 1.0, False, 0, None, last_running=0, last_waiting=0,
                                   last_kv_usage=0.1, last_loaded_loras=("x", "y", "z"), last_max_lora=2,
                                   last_running_loras=(), last_waiting_loras=()))
    assert next(iter(b.debug_view()["servers"].values()))[eps[0].key]["lora_remote"] == {}


def test_removed_endpoints_are_purged_and_capacity_follows_kv():
    s, _ = sched(cfg("prefix-cache"))
    eps = endpoints(3)
    fresh(s, eps)
    s.on_snapshot(snap(eps[0], blocks=2))  # 32 tokens * 4 B * headroom 2 / 64 B per block = 4
    for i in range(6):
        info = chat(f"r{i}", f"question {i}")
        s.candidates(KEY, eps, info)
        s.dispatched(eps[0], info)
        s.dispatched(eps[2], info)
    id0, id2 = s.endpoint_id(eps[0].key), s.endpoint_id(eps[2].key)
    assert id0 is not None and id2 is not None
    assert s.index.endpoint_len(id0) == 4 and s.index.endpoint_len(id2) > 4
    s.sync({KEY: eps[:2]})
    assert s.endpoint_id(eps[2].key) is None and id2 not in s.index.endpoints()
    assert s.candidates(KEY, eps[:2], chat("z", "q")) and len(s.candidates(KEY, eps[:2], chat("y", "q"))) == 2


def test_kvcache_aware_without_events_falls_back_and_says_so():
    s, m = sched(cfg("kvcache-aware", "least-request"))
    eps = endpoints(2)
    fresh(s, eps)
    info = chat("r1", "q")
    s.candidates(KEY, eps, info)
    assert info.hashes is not None and len(info.hashes) > 0
    fb = [x for x in m.kv_fallback.collect()[0].samples if x.name.endswith("_total")]
    assert fb and fb[0].value == 1

    class Exact:
        def match(self, info, approx, total):
            return [(s.endpoint_id(eps[1].key), 10)], 10

    s.set_kv_matcher(Exact())
    assert all(s.candidates(KEY, eps, chat(f"k{i}", "q"))[0] is eps[1] for i in range(10))


def test_round_robin_plugin_and_no_prompt_paths():
    s, _ = sched(cfg("round-robin"))
    eps = endpoints(3)
    fresh(s, eps)
    emb = RequestInfo("e", "/v1/embeddings", {"model": "demo", "input": "x"}, "demo", "", "demo")
    firsts = [s.candidates(KEY, eps, emb)[0].key for _ in range(6)]
    assert len(set(firsts)) == 3


def test_index_capacity_learns_bytes_per_token_from_usage():
    """The engine's prompt_tokens teach the index how many prompt bytes one KV token is:
    long-word prompts (12 B/token here) need 3x the entries of the 4 B/token prior."""
    s, m = sched(cfg("prefix-cache", "least-request"))
    eps = endpoints(2)
    fresh(s, eps)
    s.on_snapshot(snap(eps[0], blocks=1000))  # 16000 tokens
    id0 = s.endpoint_id(eps[0].key)
    cap0 = 16000 * 4 * 2 // 64
    assert s._capacity[id0] == cap0

    def gauge(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, labels)

    assert gauge("kthena_router_prefix_index_capacity", endpoint=eps[0].key) == cap0
    assert gauge("kthena_router_prefix_index_bytes_per_token") == 4.0
    for i in range(400):
        info = chat(f"r{i}", f"question {i}")
        s.candidates(KEY, eps, info)
        assert info.prompt_bytes > len(SYSTEM)
        s.observe_prompt_tokens(info, round(info.prompt_bytes / 12))
    bpt = gauge("kthena_router_prefix_index_bytes_per_token")
    assert bpt is not None and 11.0 < bpt < 12.5
    cap = s._capacity[id0]
    assert cap == gauge("kthena_router_prefix_index_capacity", endpoint=eps[0].key)
    assert 2.7 * cap0 < cap < 3.2 * cap0
    # a fixed maxHashCacheSize is never resized
    f, _ = sched("scheduler:\n  pluginConfig:\n  - name: prefix-cache\n    args: {maxHashCacheSize: 7}\n"
                 "  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 1}\n")
    fresh(f, eps)
    f.on_snapshot(snap(eps[0], blocks=1000))
    info = chat("f", "q")
    f.candidates(KEY, eps, info)
    f.observe_prompt_tokens(info, 1)
    assert f._capacity == {}


BALANCE = ("scheduler:\n  pluginConfig:\n  - name: prefix-cache\n    args: {balanceMisses: true}\n"
           "  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 1}\n"
           "      - {name: least-request, weight: 1}\n")


def test_balance_misses_places_new_prefixes_where_their_company_is_least():
    eps = endpoints(3)
    on, _ = sched(BALANCE)
    off, _ = sched(cfg("prefix-cache", "least-request"))
    for s in (on, off):
        fresh(s, eps)
        # eps[0] holds two prefixes, eps[1] one, eps[2] none
        for i, ep in enumerate((eps[0], eps[0], eps[1])):
            info = RequestInfo(f"seed{i}", "/v1/completions", {"prompt": f"{i} " + "x" * 4000}, "demo", "", "demo")
            s.candidates(KEY, eps, info)
            s.dispatched(ep, info)
            s.finished(ep)
    new = [RequestInfo(f"n{i}", "/v1/completions", {"prompt": f"new{i} " + "y" * 4000}, "demo", "", "demo")
           for i in range(30)]
    assert {on.candidates(KEY, eps, info)[0].key for info in new} == {eps[2].key}
    assert len({off.candidates(KEY, eps, info)[0].key for info in new}) == 3  # spread by request id
    # a hit is unaffected: the prefix stays where it is
    hit = RequestInfo("h", "/v1/completions", {"prompt": "2 " + "x" * 4000 + " more"}, "demo", "", "demo")
    assert on.candidates(KEY, eps, hit)[0] is eps[1]
    # equal occupancy everywhere: the other plugins decide (request-id spread again)
    even, _ = sched(BALANCE)
    fresh(even, eps)
    assert len({even.candidates(KEY, eps, info)[0].key for info in new}) == 3
    # a LoRA request's miss is not placed by the prefix traffic (its adapter's batch is)
    lora = [RequestInfo(f"l{i}", "/v1/completions", {"prompt": f"new{i} " + "y" * 4000}, "demo", "ad", "demo")
            for i in range(30)]
    assert len({on.candidates(KEY, eps, info)[0].key for info in lora}) == 3
    # traffic, not the count of prefixes: eps[1]'s prefix turns hot, so eps[0] (two cold
    # ones) is now the lighter of the two, and past enough requests the misses go there
    hot = RequestInfo("hot", "/v1/completions", {"prompt": "2 " + "x" * 4000}, "demo", "", "demo")
    assert on.candidates(KEY, eps, hot)[0] is eps[1]
    for _ in range(60):
        on.dispatched(eps[1], hot)
        on.finished(eps[1])
    scores = dict(on.index.miss_scores([on._ids[e.key] for e in eps], 100))
    assert on._ids[eps[1].key] not in scores and scores[on._ids[eps[0].key]] > 0


def test_balance_misses_is_validated():
    import pytest

    from kthena_router.config.errors import ConfigError

    with pytest.raises(ConfigError, match="balanceMisses.*true or false"):
        sched(BALANCE.replace("true", "'yes'"))


def test_hot_spot_guard_decisions_are_counted_per_server():
    cfg_ = load_router_configuration_bytes(cfg("prefix-cache", "least-request").encode(), source="t.yaml")
    m = RouterMetrics(CollectorRegistry())
    s = Scheduler(cfg_.scheduler, m, hot_spot_abs=4, hot_spot_rel=1.5)
    eps = endpoints(2)
    s.sync({KEY: eps})
    s.on_snapshot(snap(eps[0], running=10))
    s.on_snapshot(snap(eps[1], running=0))
    owned = chat("own", "the question")
    s.candidates(KEY, eps, owned)
    s.dispatched(eps[0], owned)
    # affinity says eps[0], which is 10+ requests busier: the guard puts load first
    assert s.candidates(KEY, eps, chat("again", "the question"))[0] is eps[1]
    name = "kthena_router_hot_spot_reorders_total"
    assert m.registry.get_sample_value(name, {"model_server": "default/demo"}) is None
    s.on_snapshot(snap(eps[0], running=10))  # published at scrape pace
    assert m.registry.get_sample_value(name, {"model_server": "default/demo"}) == 1.0
    s.on_snapshot(snap(eps[1], running=0))
    assert m.registry.get_sample_value(name, {"model_server": "default/demo"}) == 1.0


def test_prefix_affinity_does_not_pile_onto_a_stalled_endpoint():
    """The endpoint holding the prefix stops getting it once its in-flight attempt makes no
    progress for max(stallMinimum, stallFactor x TTFT), although it is not ejected."""
    import time

    s, _ = sched(cfg("prefix-cache", "least-request"))
    eps, owner = owned_prefix(s)
    assert s.candidates(KEY, eps, chat("r2", "q2"))[0] is owner  # affinity
    stall_min = owner.health.policy.stall_min_s
    owner.health.begin(now=time.monotonic() - 2 * stall_min)  # r1's attempt: no byte for long
    for i in range(20):
        cands = s.candidates(KEY, eps, chat(f"r3-{i}", "q3"))
        assert owner not in cands and len(cands) == 2
    assert owner.health.healthy


def test_panic_keeps_the_ranking_of_all_endpoints():
    s, m = sched(cfg("least-request"))
    eps = endpoints(3)
    fresh(s, eps)
    for ep in eps[:2]:
        ep.health.eject(now=1e12)  # ejected for a long time: 1 of 3 usable, under 50%
    assert sorted(e.key for e in s.candidates(KEY, eps, chat("r", "q"))) == sorted(e.key for e in eps)


def test_debug_view_shows_each_endpoints_load_as_scored() -> None:
    s, _ = sched(cfg("least-request"))
    eps = endpoints(3)
    s.sync({KEY: eps})
    s.on_snapshot(snap(eps[0], running=2, waiting=1))
    s.on_snapshot(snap(eps[1]))
    s.on_snapshot(snap(eps[2], stale=True))
    s.dispatched(eps[1], None)
    view = s.debug_view()["servers"]["default/demo"]
    assert set(view) == {ep.key for ep in eps}
    assert (view[eps[0].key]["load"], view[eps[0].key]["running"], view[eps[0].key]["waiting"]) == (3, 2, 1)
    assert (view[eps[1].key]["load"], view[eps[1].key]["in_flight"]) == (1, 1)
    # stale: infinite load, shown as null so that the view stays valid JSON
    assert view[eps[2].key]["stale"] is True and view[eps[2].key]["load"] is None
    s.finished(eps[1])
    assert s.debug_view()["servers"]["default/demo"][eps[1].key]["load"] == 0
