"""EngineStateScraper against the real simulator process with 2 DP ranks per engine.

The simulator's admin /state is the truth the scraped (split per rank) series must add
up to; faults and a killed process must turn a snapshot stale, never into an idle engine.
Engines get 2 sequences per rank and a small KV cache, so that a few long requests give
non-trivial running / waiting / KV usage that stays put while we compare.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import harness
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from kthena_router.engine_state import EndpointSnapshot, EngineStateScraper, ObservedLoad

SIM_ARGS = ["--dp-ranks", "2", "--max-num-seqs", "2", "--kv-blocks", "1024", "--seed", "3"]
LONG_TOKENS = 3000  # long enough to stay running for the whole comparison


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    flavour = request.param
    with harness.start_simulator(tmp_path_factory.mktemp(f"es-{flavour}"), engines=2, flavour=flavour,
                                 lora=["sql"], extra_args=SIM_ARGS) as s:
        yield s


def flavour_of(sim: harness.Simulator) -> str:
    return str(sim.engines()[0]["flavour"])


@pytest_asyncio.fixture(loop_scope="function")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def state(sim: harness.Simulator, i: int) -> dict:
    return sim.state(i)  # blocking but short (local admin port)


async def complete(session: aiohttp.ClientSession, url: str, prompt: str, model: str = "demo",
                   max_tokens: int = 8) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def hold_stream(session: aiohttp.ClientSession, url: str, model: str) -> None:
    """A long streaming request, read until cancelled (cancelling aborts it upstream)."""
    body = {"model": model, "prompt": "a long story about routers " * 4, "max_tokens": LONG_TOKENS,
            "stream": True}
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for _ in r.content.iter_any():
            pass


async def until(pred, timeout: float = 60.0):  # noqa: ANN001, ANN201
    async with asyncio.timeout(timeout):
        while True:
            value = await pred() if asyncio.iscoroutinefunction(pred) else pred()
            if value:
                return value
            await asyncio.sleep(0.05)


def metrics_totals(text: str, family: str) -> tuple[float, float]:
    """(sum, count) of a histogram over all ranks, with prometheus_client's own parser."""
    s = c = 0.0
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == family + "_sum":
                s += sample.value
            elif sample.name == family + "_count":
                c += sample.value
    return s, c


async def fetch_metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as r:
        return await r.text()


def get(sc: EngineStateScraper, key: str) -> EndpointSnapshot:
    snap = sc.get(key)
    assert snap is not None
    return snap


async def test_scraped_values_match_engine_state(sim: harness.Simulator,
                                                 session: aiohttp.ClientSession) -> None:
    flavour = flavour_of(sim)
    prefix = "sglang" if flavour == "sglang" else "vllm"
    url0, url1 = sim.urls
    sc = EngineStateScraper(session, interval_s=1.0, timeout_s=10.0)
    sc.set_endpoints([("e0", url0, flavour), ("e1", url1, flavour)])

    # --- idle engines, then a batch of finished requests: interval means and hit rate ---
    await sc.scrape_once()
    before_state = state(sim, 0)
    before_ttft = metrics_totals(await fetch_metrics(session, url0), f"{prefix}:time_to_first_token_seconds")
    shared = "You are a helpful assistant. Answer briefly and precisely. " * 8
    await asyncio.gather(*(complete(session, url0, shared + f"question {i}") for i in range(8)))
    await sc.scrape_once()
    after_state = state(sim, 0)
    after_ttft = metrics_totals(await fetch_metrics(session, url0), f"{prefix}:time_to_first_token_seconds")

    s0 = get(sc, "e0")
    assert not s0.stale and s0.dp_ranks == 2
    assert (s0.running, s0.waiting) == (0, 0)  # idle, and known to be idle
    want_ttft = (after_ttft[0] - before_ttft[0]) / (after_ttft[1] - before_ttft[1])
    assert after_ttft[1] - before_ttft[1] == 8
    assert s0.ttft_mean_s == pytest.approx(want_ttft, rel=1e-9)
    assert s0.ttft_samples == 8
    assert s0.tpot_mean_s is not None and s0.tpot_mean_s > 0
    if flavour == "vllm":
        dq = sum(r["prefix_queries_total"] for r in after_state["ranks"]) - \
            sum(r["prefix_queries_total"] for r in before_state["ranks"])
        dh = sum(r["prefix_hits_total"] for r in after_state["ranks"]) - \
            sum(r["prefix_hits_total"] for r in before_state["ranks"])
        assert dh > 0  # the shared prefix was hit: the test checks a real ratio
        assert s0.prefix_hit_rate == pytest.approx(dh / dq)
    else:  # SGLang exports a lifetime rate per rank: the mean over ranks
        rates = [r["prefix_hits_total"] / r["prefix_queries_total"]
                 for r in after_state["ranks"] if r["prefix_queries_total"]]
        rates += [0.0] * (2 - len(rates))
        assert s0.prefix_hit_rate == pytest.approx(sum(rates) / 2)

    # --- load: 6 long requests on engine 0 (2 seqs per rank -> 4 running, 2 waiting) -------
    models = ["sql", "demo", "sql", "demo", "sql", "demo"]
    holders = [asyncio.create_task(hold_stream(session, url0, m)) for m in models]
    try:
        await until(lambda: (st := state(sim, 0))["running"] == 4 and st["waiting"] == 2
                    and st["kv_usage"] > 0)
        st_before = state(sim, 0)
        await sc.scrape_once()
        st_after = state(sim, 0)
        s0 = get(sc, "e0")
        assert (s0.running, s0.waiting) == (st_before["running"], st_before["waiting"]) == (4, 2)
        assert (st_after["running"], st_after["waiting"]) == (4, 2)
        # KV usage only grows while these decode: the scrape lies between the two reads
        assert st_before["kv_usage"] <= s0.kv_usage <= st_after["kv_usage"]  # type: ignore[operator]
        assert s0.kv_usage == pytest.approx(sum(r["kv_usage"] for r in st_after["ranks"]) / 2, rel=0.5)
        if flavour == "vllm":
            running = set(s0.running_loras or ())
            waiting = set(s0.waiting_loras or ())
            assert running | waiting == {"sql"}
            assert s0.max_lora == 4
        assert s0.loaded_loras == ("sql",)
        s1 = get(sc, "e1")
        assert not s1.stale and (s1.running, s1.waiting, s1.kv_usage) == (0, 0, 0.0)

        # an adapter loaded at run time shows at the next scrape
        async with session.post(url1 + "/v1/load_lora_adapter",
                                json={"lora_name": "extra", "lora_path": "/loras/extra"}) as r:
            assert r.status == 200
        await sc.scrape_once(["e1"])
        assert get(sc, "e1").loaded_loras == ("extra", "sql")
    finally:
        for t in holders:
            t.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        async with session.post(url1 + "/v1/unload_lora_adapter", json={"lora_name": "extra"}):
            pass
    await until(lambda: state(sim, 0)["running"] == 0)


async def test_refused_connections_turn_stale_not_idle(sim: harness.Simulator,
                                                       session: aiohttp.ClientSession) -> None:
    flavour = flavour_of(sim)
    url0, url1 = sim.urls
    obs = ObservedLoad()
    sc = EngineStateScraper(session, interval_s=0.2, timeout_s=2.0, observed=obs)
    sc.set_endpoints([("e0", url0, flavour), ("e1", url1, flavour)])
    runner = asyncio.create_task(sc.run())
    try:
        await until(lambda: all((s := sc.get(k)) is not None and not s.stale for k in ("e0", "e1")))
        sim.set_faults(1, refuse_connections=True)
        try:
            s1 = await until(lambda: (s := sc.get("e1")) is not None and s.stale and s)
            assert s1.running is None and s1.waiting is None and s1.queue is None
            assert s1.kv_usage is None and s1.ttft_mean_s is None
            assert s1.last_running == 0 and s1.consecutive_failures >= 1
            obs.start("e1")
            assert obs.queue_estimate("e1", sc.get("e1")) is None  # unknown, not 0 or 1
            s0 = get(sc, "e0")
            assert not s0.stale and s0.running == 0  # the healthy engine is unaffected
        finally:
            sim.reset_faults(1)
        await until(lambda: (s := sc.get("e1")) is not None and not s.stale)
        s1 = get(sc, "e1")
        assert s1.running == 0 and s1.consecutive_failures == 0
    finally:
        sc.stop()
        await asyncio.wait_for(runner, 10)


async def test_killed_engine_process_turns_stale(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    own = harness.start_simulator(tmp_path, engines=1, fast=True, extra_args=["--dp-ranks", "2"])
    try:
        sc = EngineStateScraper(session, interval_s=0.2, timeout_s=2.0)
        sc.set_endpoints([("e", own.urls[0], "vllm")])
        await sc.scrape_once()
        assert get(sc, "e").running == 0 and not get(sc, "e").stale
    finally:
        own.process.kill_group()
    await sc.scrape_once()
    s = get(sc, "e")
    assert s.stale and s.running is None and s.queue is None and s.last_running == 0
