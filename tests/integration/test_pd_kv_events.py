"""Exact KV-event matching on the PD sides (pd/side_kv.py, docs/kv-exact-default.md "PD
sides"), against real simulator engines in PD mode (vLLM NixlConnector) publishing vLLM KV
events over ZMQ, and real routers.

Engines: 0, 1, 2 prefill (0 and 1 labelled `kthena.io/kv-events-port`, 2 not), 3 and 4
decode (both labelled), one group. Routers:
- `auto`: kvcache-aware's tokenizers in `scheduler.pluginConfig` and nothing else for the
  prefill side (its default pipeline, prefix-cache + least-request, gets exact matching
  automatically); the decode side LISTS kvcache-aware + least-request.
- `off`: the same file with `kvEvents.exactMatching: off` and default sides: no side
  follows any stream.
Prompts sent straight to an engine (never through a router) fill that engine's cache; the
`auto` router then sends that prompt's prefill hop (prefill engines) or decode hop (decode
engines) to it, the `off` router cannot know.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import harness
import kv_support as kvs
import pd_harness as pdh
from loadtest.ports import free_port_block

ROLES = ("prefill", "prefill", "prefill", "decode", "decode")
PREFILL, DECODE = (0, 1, 2), (3, 4)
LABELLED = (0, 1, 3, 4)
GROUPS = 6
CONFIG = """\
scheduler:
  pluginConfig:
  - name: kvcache-aware
    args:
      tokenizers: {{demo: {tok}}}
      hashSeed: "0"
{extra}"""
# prefix-cache outweighs least-request on the prefill side (as in test_kv_exact_default.py:
# one request's difference in the scraped load must not outweigh a whole prefix here)
DECODE_LISTED = """\
pd:
  prefill:
    plugins:
      Score:
        enabled:
        - {name: prefix-cache, weight: 3}
        - {name: least-request, weight: 1}
  decode:
    plugins:
      Score:
        enabled:
        - {name: kvcache-aware, weight: 1}
        - {name: least-request, weight: 1}
"""


def config_docs(ports: list[int], kv_base: int) -> list[dict[str, Any]]:
    eps = []
    for i, p in enumerate(ports):
        labels = {"app": "pd", "group": "a", "role": ROLES[i]}
        if i in LABELLED:
            labels.update({"kthena.io/kv-events-port": str(kv_base + 2 * i),
                           "kthena.io/kv-events-replay-port": str(kv_base + 2 * i + 1)})
        eps.append((p, labels, None))
    return [harness.route_doc("pd", "demo", "pd"), pdh.pd_server("pd", {"app": "pd"}, connector="nixl"),
            pdh.endpoints("pd-engines", eps)]


def hop_engines(sim: harness.Simulator, rid: str) -> tuple[int, int]:
    """(prefill engine, decode engine) of a routed request."""
    seen = pdh.hops(sim, rid)
    p = [i for i in seen if i in PREFILL]
    d = [i for i in seen if i in DECODE]
    assert len(p) == 1 and len(d) == 1, seen
    return p[0], d[0]


def pd_view(router: harness.Router) -> dict[str, Any]:
    r = router.admin_get("/debug/pd")
    r.raise_for_status()
    return dict(r.json()["workers"][0])


def streams(router: harness.Router, side: str) -> dict[str, Any] | None:
    got = pd_view(router)["kv_events"][side]
    return None if got is None else dict(got["endpoints"])


def metric(router: harness.Router, name: str, **labels: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), name, **labels)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Simulator, harness.Router,
                                                                      harness.Router, list[str]]]:
    tmp = tmp_path_factory.mktemp("pdkv")
    kv_base = free_port_block(2 * len(ROLES))
    sim = harness.start_simulator(tmp, len(ROLES), extra_args=[
        "--roles", ",".join(ROLES), "--kv-events-port-base", str(kv_base)])
    routers: list[harness.Router] = []
    try:
        config = harness.write_config(tmp / "routes.yaml", config_docs(sim.ports, kv_base))
        auto = harness.write_config(tmp / "auto.yaml", CONFIG.format(tok=kvs.TOKENIZER, extra=DECODE_LISTED))
        off = harness.write_config(tmp / "off.yaml", CONFIG.format(tok=kvs.TOKENIZER,
                                                                  extra="kvEvents: {exactMatching: off}\n"))
        routers.append(harness.start_router(config, tmp, extra_args=["--router-config", str(auto)]))
        routers.append(harness.start_router(config, tmp, extra_args=["--router-config", str(off)]))
        keys = [f"{harness.HOST}:{p}" for p in sim.ports]
        yield sim, routers[0], routers[1], keys
    finally:
        for r in routers:
            r.stop()
        sim.stop()


def sides_brief(router: harness.Router) -> dict[str, Any]:
    return {side: {k: kvs.brief(e) for k, e in (streams(router, side) or {}).items()} for side in ("prefill", "decode")}


def wait_streams_up(router: harness.Router, keys: list[str]) -> None:
    want = {"prefill": {keys[i]: "up" for i in (0, 1)}, "decode": {keys[i]: "up" for i in DECODE}}
    harness.wait_until(lambda: {side: {k: e["state"] for k, e in (streams(router, side) or {}).items()}
                                for side in want} == want, 60, interval=0.2,
                       what=f"the PD sides' streams up, only the labelled ones (last: {pd_view(router)['kv_events']})")


def test_each_side_follows_its_own_labelled_engines_and_off_follows_none(setup: Any) -> None:
    sim, auto, off, keys = setup
    wait_streams_up(auto, keys)
    view = pd_view(auto)["kv_events"]
    assert view["prefill"]["mode"] == "auto" and view["decode"]["mode"] == "listed", view
    assert pd_view(off)["kv_events"] == {"prefill": None, "decode": None}
    assert off.admin_get("/debug/kv_ownership").status_code == 404  # nor the scheduler section
    assert metric(auto, "kthena_router_kv_events_stream_up", endpoint=keys[0]) == 1


def warm_directly(sim: harness.Simulator, router: harness.Router, tag: str, engines: tuple[int, ...],
                  keys: list[str], side: str) -> None:
    """Group g's prompt straight to engine engines[g % n]; then wait until `router`'s
    `side` matcher applied each engine's last KV-event batch."""
    for g in range(GROUPS):
        i = engines[g % len(engines)]
        kvs.post(f"http://{harness.HOST}:{sim.ports[i]}", tag, g, f"warm-{tag}{g}")
    for i in engines:
        kvs.wait_table_is_engine_cache(sim, i, lambda i=i: (streams(router, side) or {}).get(keys[i]))
    kvs.wait_rescraped(sim, list(engines))


def test_prefill_hops_go_to_the_prefill_engine_that_holds_the_prompt(setup: Any) -> None:
    sim, auto, off, keys = setup
    wait_streams_up(auto, keys)
    want = [(0, 1)[g % 2] for g in range(GROUPS)]
    warm_directly(sim, auto, "p", (0, 1), keys, "prefill")
    kvs.wait_engines_fresh(auto, keys)
    before = metric(auto, "kthena_router_kvcache_aware_fallback_total", reason="stream_down")
    for g in range(GROUPS):
        kvs.post(auto.base_url, "p", g, f"auto-p{g}")
    got = [hop_engines(sim, f"auto-p{g}")[0] for g in range(GROUPS)]
    assert got == want, (got, kvs.engine_view(auto, keys), sides_brief(auto))
    assert metric(auto, "kthena_router_kvcache_aware_fallback_total", reason="stream_down") == before
    # control: the default sides without exact matching cannot know what the engines hold
    warm_directly(sim, auto, "q", (0, 1), keys, "prefill")
    kvs.wait_engines_fresh(off, keys)
    for g in range(GROUPS):
        kvs.post(off.base_url, "q", g, f"off-q{g}")
    got = [hop_engines(sim, f"off-q{g}")[0] for g in range(GROUPS)]
    assert got != want, (got, pd_view(off))


def test_decode_hops_go_to_the_decode_engine_that_holds_the_prompt(setup: Any) -> None:
    sim, auto, _, keys = setup
    wait_streams_up(auto, keys)
    want = [DECODE[g % 2] for g in range(GROUPS)]
    warm_directly(sim, auto, "d", DECODE, keys, "decode")  # a plain request: a decode engine computes it
    kvs.wait_engines_fresh(auto, keys)
    for g in range(GROUPS):
        kvs.post(auto.base_url, "d", g, f"auto-d{g}")
    got = [hop_engines(sim, f"auto-d{g}")[1] for g in range(GROUPS)]
    assert got == want, (got, kvs.engine_view(auto, keys), sides_brief(auto))


def test_prefill_engine_without_a_stream_keeps_approximate_affinity(setup: Any) -> None:
    sim, auto, _, keys = setup
    kvs.wait_engines_fresh(auto, keys)
    with ThreadPoolExecutor(8) as pool:  # together: least-request spreads them over the engines
        list(pool.map(lambda g: kvs.post(auto.base_url, "r", g, f"r1-{g}"), range(8)))
    chosen = [hop_engines(sim, f"r1-{g}")[0] for g in range(8)]
    assert 2 in chosen, (chosen, pd_view(auto))  # the unlabelled engine got some (else this says nothing)
    kvs.wait_engines_fresh(auto, keys)
    for g in range(8):
        kvs.post(auto.base_url, "r", g, f"r2-{g}")
    assert [hop_engines(sim, f"r2-{g}")[0] for g in range(8)] == chosen, pd_view(auto)
