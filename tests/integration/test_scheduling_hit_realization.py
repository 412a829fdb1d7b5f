"""prefill-cost's hit realization end to end: a real router and a real simulator whose KV
cache is far smaller than the router's index (a fixed maxHashCacheSize). The index credits
the engine with every document it was sent; the engine evicts them (LRU). The figure the
router measures, from the engine's prefix-cache counters against its own predictions, is
read from /debug/scheduler while requests flow; nothing is timed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness

CONFIG = """\
scheduler:
  pluginConfig:
  - name: prefix-cache
    args: {maxHashCacheSize: 100000}
  - name: prefill-cost
    args: {realizedPrefix: true}
  plugins:
    Score:
      enabled:
      - {name: prefix-cache, weight: 1}
      - {name: prefill-cost, weight: 1}
"""
DOCS = 8


def _doc(n: int) -> str:
    return " ".join(f"doc{n}-w{j}" for j in range(400))


def _realization(router: harness.Router, port: int) -> float:
    r = router.admin_get("/debug/scheduler")
    r.raise_for_status()
    (worker,) = r.json()["workers"]
    (eps,) = worker["servers"].values()
    return float(eps[f"{harness.HOST}:{port}"]["hit_realization"])


def _ask(client: httpx.Client, base: str, doc: str) -> dict[str, Any]:
    r = client.post(base + "/v1/chat/completions", json={
        "model": "demo", "max_tokens": 1,
        "messages": [{"role": "system", "content": doc}, {"role": "user", "content": "summarise"}]})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def _until(router: harness.Router, port: int, ask: Callable[[int], object], done: Callable[[float], bool],
           most: int) -> float:
    """Keep traffic flowing (`ask(i)`, one request at a time) until the router's figure
    satisfies `done`: it is measured per scrape interval, so it settles on a steady stream,
    not on a one-off burst (a request may be counted by the engine an interval after its
    dispatch). Fails after `most` requests."""
    for i in range(most):
        ask(i)
        r = _realization(router, port)
        if done(r):
            return r
    raise AssertionError(f"hit realization {r} after {most} requests")


@pytest.mark.parametrize("interface", ["rust", "rsgi"])
def test_an_engine_that_evicts_what_the_index_credits_is_measured(tmp_path: Path, interface: str) -> None:
    sim = harness.start_simulator(tmp_path, 1, extra_args=["--time-scale", "1", "--block-size", "16",
                                                           "--kv-blocks", "480"])
    client = httpx.Client(timeout=60)
    router: harness.Router | None = None
    try:
        config = harness.write_config(tmp_path / "router.yaml", harness.engine_config(sim.ports))
        sched = tmp_path / "scheduler.yaml"
        sched.write_text(CONFIG)
        router = harness.start_router(config, tmp_path, extra_args=[
            "--router-config", str(sched), "--scrape-interval-s", "0.2", "--interface", interface])
        base, port = router.base_url, sim.ports[0]
        # each document takes over a third of the engine's KV: it holds two at most
        tokens = _ask(client, base, _doc(0))["prompt_tokens"]
        assert 480 * 16 / 3 < tokens < 480 * 16 / 2, tokens
        # 1. eight documents in turn: from the second round on, the index credits the
        # engine with each, which the engine evicted before its turn came again
        _until(router, port, lambda i: _ask(client, base, _doc(1 + i % DOCS)), lambda r: r < 0.5, 20 * DOCS)
        # 2. one document again and again: the engine serves what the index predicts (but
        # the partial last block), and the figure recovers as the evictions age out
        _until(router, port, lambda i: _ask(client, base, _doc(0)), lambda r: r > 0.9, 400)
    finally:
        if router is not None:
            router.stop()
        client.close()
        sim.stop()
