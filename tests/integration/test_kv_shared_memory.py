"""Shared prefixes keep the approximate index's memory under exact KV-event matching
(kvEvents.sharedPrefixMemory, on by default for automatic matching).

Real simulator engines (physics mode, small KV caches, publishing vLLM KV events) and two
real routers: `on` (the default) and `off` (sharedPrefixMemory: false). Through each router
go a group's two questions on one system prompt (a shared prefix: it branches) and a
two-turn conversation (a private context: each turn extends the last). Then prompts sent
straight to the engines evict all of it, and the routers' tables follow the engines'
events. Read from kthena_router_prefix_cache_match_ratio (the best candidate's share of
the prompt), the group's next question:
- `on`: still matches its system prompt on the engine that served it (the index's memory
  of a shared prefix outlives the engine's eviction, so the group goes back there);
- `off`: matches nothing (exact matching alone knows the engine evicted it).
The conversation's next turn matches nothing on either router, so an evicted private
context is placed by load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness
import kv_support as kvs
from loadtest.ports import free_port_block

ENGINES = 2
KV_BLOCKS = 64  # 16-token blocks: about three of these prompts
RULES = "Answer briefly and cite the house rules. " * 40


def chat(url: str, messages: list[dict[str, str]]) -> str:
    with httpx.Client(timeout=60) as c:
        r = c.post(url + "/v1/chat/completions", json={"model": "demo", "max_tokens": 4, "messages": messages})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def group(tag: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Team {tag} assistant. {RULES}"}, {"role": "user", "content": question}]


def ratio_sum(router: harness.Router) -> tuple[float, float]:
    fams = harness.parse_metrics(router.metrics_text())
    return (harness.metric_value(fams, "kthena_router_prefix_cache_match_ratio_sum", model="demo"),
            harness.metric_value(fams, "kthena_router_prefix_cache_match_ratio_count", model="demo"))


def match_ratio(router: harness.Router, messages: list[dict[str, str]]) -> float:
    """The best candidate's match ratio for this one request."""
    s0, n0 = ratio_sum(router)
    chat(router.base_url, messages)
    s1, n1 = ratio_sum(router)
    assert n1 == n0 + 1
    return s1 - s0


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Simulator, dict[str, harness.Router],
                                                                      list[str]]]:
    tmp = tmp_path_factory.mktemp("kvmem")
    kv_base = free_port_block(2 * ENGINES)
    sim = harness.start_simulator(tmp, ENGINES, extra_args=["--kv-events-port-base", str(kv_base),
                                                            "--kv-blocks", str(KV_BLOCKS)])
    routers: dict[str, harness.Router] = {}
    try:
        routes = harness.write_config(tmp / "routes.yaml", kvs.labelled_config_docs(sim.ports, kv_base))
        for name, extra in (("on", ""), ("off", "kvEvents: {sharedPrefixMemory: false}\n")):
            rc = tmp / f"{name}.yaml"
            rc.write_text(kvs.AUTO_CONFIG.format(tok=kvs.TOKENIZER, extra=extra))
            routers[name] = harness.start_router(routes, tmp / name, extra_args=["--router-config", str(rc)])
        keys = [f"{harness.HOST}:{p}" for p in sim.ports]
        for r in routers.values():
            harness.wait_until(lambda r=r: {e["state"] for e in kvs.ownership(r).values()} == {"up"}, 60,
                               interval=0.2, what="both streams up")
        yield sim, routers, keys
    finally:
        for r in routers.values():
            r.stop()
        sim.stop()


def test_a_shared_prefix_outlives_eviction_and_a_private_context_does_not(setup: Any) -> None:
    sim, routers, keys = setup
    turns: dict[str, list[dict[str, str]]] = {}
    for name, r in routers.items():
        chat(r.base_url, group(name, "What is the first rule?"))
        chat(r.base_url, group(name, "Which rule matters most today?"))  # the system prompt branches
        talk = [{"role": "system", "content": f"Conversation {name} only. {RULES}"},
                {"role": "user", "content": "Tell me a story."}]
        reply = chat(r.base_url, talk)
        talk += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on, please."}]
        reply = chat(r.base_url, talk)  # extends the first turn: no branch
        turns[name] = talk + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    # evict everything: distinct prompts straight to each engine, more than its cache holds
    for i, port in enumerate(sim.ports):
        for k in range(4):
            chat(f"http://{harness.HOST}:{port}",
                 [{"role": "user", "content": f"Flush {i}-{k}: " + f"filler words number {k} " * 80}])
    for r in routers.values():
        for i in range(ENGINES):
            kvs.wait_table_is_engine_cache(sim, i, lambda r=r, i=i: kvs.ownership(r).get(keys[i]))
    kvs.wait_engines_fresh(routers["on"], keys)

    off = match_ratio(routers["off"], group("off", "Is there a rule about tea?"))
    assert off == 0.0  # exact matching alone: the engines evicted the system prompt
    on = match_ratio(routers["on"], group("on", "Is there a rule about tea?"))
    assert on >= 0.6, on  # the system prompt is most of the prompt
    assert match_ratio(routers["on"], turns["on"]) == 0.0  # a private context: exact only
    assert match_ratio(routers["off"], turns["off"]) == 0.0
