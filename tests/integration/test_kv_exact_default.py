"""Exact KV-event matching by default (scheduling/exact_auto.py): a prefix-cache +
least-request router whose configuration gives kvcache-aware's tokenizers matches
exactly on the endpoints that advertise a KV-event port, and approximately elsewhere.

Real simulator engines (physics mode, publishing vLLM KV events over ZMQ) and real
routers. Engines 0 and 1 carry the `kthena.io/kv-events-port` labels, engine 2 does not.
- Prompts sent straight to an engine (never through the router) fill its cache; the
  `auto` router then sends them to that engine (it learned them from the engine's
  events), while a router with `kvEvents.exactMatching: off` knows nothing of them.
- The unlabelled engine keeps the approximate index's affinity (dispatch-time inserts).
- An engine whose stream stops falls back to the approximate index, per endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness
import kv_support as kvs
from loadtest.ports import free_port_block

ENGINES = 3
LABELLED = (0, 1)
GROUPS = 6
def config_docs(ports: list[int], kv_base: int) -> list[dict[str, Any]]:
    labels = {"app": "demo"}
    eps = []
    for i, p in enumerate(ports):
        ep_labels = dict(labels)
        if i in LABELLED:
            ep_labels.update({"kthena.io/kv-events-port": str(kv_base + 2 * i),
                              "kthena.io/kv-events-replay-port": str(kv_base + 2 * i + 1)})
        eps.append({"address": harness.HOST, "port": p, "labels": ep_labels})
    return [harness.route_doc("demo", "demo", "demo"), harness.server_doc("demo", "demo", labels),
            {"apiVersion": harness.ENDPOINTS_API, "kind": "Endpoints", "metadata": {"name": "demo-engines"},
             "spec": {"endpoints": eps}}]


def served_by(sim: harness.Simulator, rid: str) -> int:
    (i,) = [i for i in range(ENGINES) if any(e["request_id"] == rid for e in sim.requests(i)["log"])]
    return i


def metric(router: harness.Router, name: str, **labels: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), name, **labels)


CONFIGS: dict[str, Path] = {}  # the setup's files, for the rust_auto router


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Simulator, harness.Router,
                                                                      harness.Router, list[str]]]:
    tmp = tmp_path_factory.mktemp("kvdef")
    kv_base = free_port_block(2 * ENGINES)
    sim = harness.start_simulator(tmp, ENGINES, extra_args=["--kv-events-port-base", str(kv_base)])
    routers: list[harness.Router] = []
    try:
        config = harness.write_config(tmp / "routes.yaml", config_docs(sim.ports, kv_base))
        auto = harness.write_config(tmp / "auto.yaml", kvs.AUTO_CONFIG.format(tok=kvs.TOKENIZER, extra=""))
        CONFIGS.update(routes=config, auto=auto, work=tmp)
        off = harness.write_config(tmp / "off.yaml", kvs.AUTO_CONFIG.format(
            tok=kvs.TOKENIZER, extra="kvEvents: {exactMatching: off}\n"))
        routers.append(harness.start_router(config, tmp, extra_args=["--router-config", str(auto)]))
        routers.append(harness.start_router(config, tmp, extra_args=["--router-config", str(off)]))
        keys = [f"{harness.HOST}:{p}" for p in sim.ports]
        yield sim, routers[0], routers[1], keys
    finally:
        for r in routers:
            r.stop()
        sim.stop()


def test_only_labelled_endpoints_are_followed_and_off_follows_none(setup: Any) -> None:
    sim, auto, off, keys = setup
    harness.wait_until(lambda: {k: e["state"] for k, e in kvs.ownership(auto).items()}
                       == {keys[i]: "up" for i in LABELLED}, 60, interval=0.2, what="labelled streams up, only")
    assert off.admin_get("/debug/kv_ownership").status_code == 404  # no matcher at all
    assert metric(auto, "kthena_router_kv_events_stream_up", endpoint=keys[0]) == 1


def warm_directly(sim: harness.Simulator, router: harness.Router, tag: str, keys: list[str]) -> None:
    """Group g's prompt straight to labelled engine g % 2; then wait until `router`'s table
    holds exactly each engine's cache (its last KV-event batch applied)."""
    for g in range(GROUPS):
        i = LABELLED[g % len(LABELLED)]
        kvs.post(f"http://{harness.HOST}:{sim.ports[i]}", tag, g, f"warm-{tag}{g}")
    for i in LABELLED:
        kvs.wait_table_is_engine_cache(sim, i, lambda i=i: kvs.ownership(router).get(keys[i]))
    kvs.wait_rescraped(sim, list(LABELLED))


def test_auto_routes_to_the_engine_that_holds_the_prefix_off_does_not(setup: Any) -> None:
    sim, auto, off, keys = setup
    want = [LABELLED[g % len(LABELLED)] for g in range(GROUPS)]
    warm_directly(sim, auto, "p", keys)
    kvs.wait_engines_fresh(auto, keys)
    before = metric(auto, "kthena_router_kvcache_aware_fallback_total", reason="stream_down")
    for g in range(GROUPS):
        kvs.post(auto.base_url, "p", g, f"auto-p{g}")
    got = [served_by(sim, f"auto-p{g}") for g in range(GROUPS)]
    assert got == want, (got, kvs.engine_view(auto, keys), {k: kvs.brief(e) for k, e in kvs.ownership(auto).items()})
    assert metric(auto, "kthena_router_kvcache_aware_fallback_total", reason="stream_down") == before
    # the control: the same pipeline without exact matching cannot know what the engines
    # hold (each group lands on the warmed engine with probability ~1/3)
    warm_directly(sim, auto, "q", keys)
    kvs.wait_engines_fresh(off, keys)
    for g in range(GROUPS):
        kvs.post(off.base_url, "q", g, f"off-q{g}")
    got = [served_by(sim, f"off-q{g}") for g in range(GROUPS)]
    assert got != want, got


def test_endpoint_without_a_stream_keeps_approximate_affinity(setup: Any) -> None:
    sim, auto, _, _ = setup
    with ThreadPoolExecutor(8) as pool:  # together: least-request spreads them over the engines
        list(pool.map(lambda g: kvs.post(auto.base_url, "r", g, f"r1-{g}"), range(8)))
    chosen = [served_by(sim, f"r1-{g}") for g in range(8)]
    assert 2 in chosen, chosen  # the unlabelled engine got some (else this test says nothing)
    for g in range(8):
        kvs.post(auto.base_url, "r", g, f"r2-{g}")
    assert [served_by(sim, f"r2-{g}") for g in range(8)] == chosen


@pytest.fixture(scope="module")
def rust_auto(setup: Any) -> Iterator[harness.Router]:
    """The `auto` pipeline behind the Rust front end (docs/rust-front.md), started only
    for the test that uses it."""
    router = harness.start_router(CONFIGS["routes"], CONFIGS["work"],
                                  extra_args=["--router-config", str(CONFIGS["auto"]), "--interface", "rust"])
    try:
        yield router
    finally:
        router.stop()


def test_rust_front_awaits_prepare_and_routes_exactly(setup: Any, rust_auto: harness.Router) -> None:
    """With a KV-event matcher in play the scheduler's prepare() has work: the Rust front's
    decision awaits it (a task; without a matcher, or for a prompt short enough to tokenize
    inline, it decides at once) and still takes the fast path, routing each group to the
    engine that holds its prefix. Long prompts ("L" tags) and short ones."""
    sim, _, _, keys = setup
    router = rust_auto
    harness.wait_until(lambda: {k: e["state"] for k, e in kvs.ownership(router).items()}
                       == {keys[i]: "up" for i in LABELLED}, 60, interval=0.2, what="labelled streams up")
    want = [LABELLED[g % len(LABELLED)] for g in range(GROUPS)]
    for tag in ("Lz", "z"):  # tags no other test uses
        warm_directly(sim, router, tag, keys)
        kvs.wait_engines_fresh(router, keys)
        fast = metric(router, "kthena_router_front_decisions_total", decision="fast")
        for g in range(GROUPS):
            kvs.post(router.base_url, tag, g, f"rust-{tag}{g}")
        got = [served_by(sim, f"rust-{tag}{g}") for g in range(GROUPS)]
        assert got == want, (tag, got, kvs.engine_view(router, keys),
                             {k: kvs.brief(e) for k, e in kvs.ownership(router).items()})
        assert metric(router, "kthena_router_front_decisions_total", decision="fast") >= fast + GROUPS, tag


def test_stopped_stream_falls_back_to_the_approximate_index(setup: Any) -> None:
    sim, auto, _, keys = setup  # last: a stopped publisher stays stopped
    r = httpx.post(f"{sim.admin_url}/admin/engines/0/kv_events/stop", timeout=30)
    r.raise_for_status()
    harness.wait_until(lambda: metric(auto, "kthena_router_kv_events_stream_up", endpoint=keys[0]) == 0, 30,
                       interval=0.1, what="engine 0's stream down in the router")
    assert kvs.ownership(auto)[keys[0]]["blocks"] == []  # nothing trusted from a dead stream
    kvs.wait_engines_fresh(auto, keys)
    before = metric(auto, "kthena_router_kvcache_aware_fallback_total", reason="stream_down")
    # group g of "p" went to engine g % 2 through this router: its dispatch-time inserts
    # keep engine 0's groups there although its stream is gone
    for g in range(0, GROUPS, 2):
        kvs.post(auto.base_url, "p", g, f"down-p{g}")
        assert served_by(sim, f"down-p{g}") == 0, g
    assert metric(auto, "kthena_router_kvcache_aware_fallback_total", reason="stream_down") > before
