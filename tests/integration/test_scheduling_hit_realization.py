"""prefill-cost's hit realization end to end: a real router and a real simulator whose KV
cache is far smaller than the router's index (a fixed maxHashCacheSize). The index credits
the engine with every document it was sent; the engine evicts them (LRU). The figure the
router measures, from the engine's prefix-cache counters against its own predictions, is
read from /debug/scheduler; nothing is timed."""

from __future__ import annotations

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


@pytest.mark.parametrize("interface", ["rust", "rsgi"])
def test_an_engine_that_evicts_what_the_index_credits_is_measured(tmp_path: Path, interface: str) -> None:
    sim = harness.start_simulator(tmp_path, 1, extra_args=["--time-scale", "1", "--block-size", "16",
                                                           "--kv-blocks", "480"])
    client = httpx.Client(timeout=60)
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
        # 1. the same document again and again: the engine serves what the index predicts
        # but the partial last block and the one token it always computes
        for _ in range(6):
            _ask(client, base, _doc(0))
        # (below 1 by that rounding: measured, not the unmeasured default of 1)
        harness.wait_until(lambda: 0.99 < _realization(router, port) < 1.0, 30, what="realization 1 measured")
        # 2. eight documents in turn, twice: the index credits the engine with all eight on
        # the second round, the engine has evicted each before its turn comes again
        for _ in range(2):
            for n in range(1, DOCS + 1):
                _ask(client, base, _doc(n))
        # the first round's cold misses predicted nothing; the second round's predicted hits
        # are misses on the engine
        harness.wait_until(lambda: _realization(router, port) < 0.5, 30, what="the evictions measured")
        router.stop()
    finally:
        client.close()
        sim.stop()
