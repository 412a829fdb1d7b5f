"""prefill-cost end to end (issue 15 step 11): a real router and a real simulator (physics
engine, time scale 1). Decisions are read from the engines' request logs, never from
wall-clock times.

prefill-cost alone (no load plugin), so that what is asserted is its own cost: cache hits
stay on the prefix's holder (their uncached blocks are few), and cold prompts in progress
count as pending work where they went, so the next cold prompt goes elsewhere."""

from __future__ import annotations

from pathlib import Path

import httpx

import harness

CONFIG = """\
scheduler:
  plugins:
    Score:
      enabled:
      - {name: prefill-cost, weight: 1}
"""
# ~2.4k words: ~190 index blocks
SYSTEM = " ".join(f"rule{i % 97} applies to case{i}." for i in range(800))


def _body(system: str, question: str, max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {"model": "demo", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def test_hits_stay_on_the_holder_and_pending_cold_prompts_spread(tmp_path: Path) -> None:
    sim = harness.start_simulator(tmp_path, 2, extra_args=["--time-scale", "1"])
    client = httpx.Client(timeout=120)
    streams: list[httpx.Response] = []
    try:
        config = harness.write_config(tmp_path / "router.yaml", harness.engine_config(sim.ports))
        sched = tmp_path / "scheduler.yaml"
        sched.write_text(CONFIG)
        # engine TTFTs come only from finished requests (one scrape at start, then rarely)
        router = harness.start_router(config, tmp_path, extra_args=[
            "--router-config", str(sched), "--scrape-interval-s", "60"])
        base = router.base_url
        # 1. one cold request, then cache hits, one at a time: every one on the holder
        # (a load-blind plugin without the prefix's size would spread them by request id)
        sim.reset_requests()
        for i in range(11):
            r = client.post(base + "/v1/chat/completions", json=_body(SYSTEM, f"question {i}", 2))
            assert r.status_code == 200, r.text
        got = sim.received()
        assert sorted(got) == [0, 11], got
        # 2. pairs of long cold prompts, each pair in flight together: the first one's
        # prefill is pending work on its engine, so the second goes to the other engine
        for pair in range(3):
            sim.reset_requests()
            opened = []
            for k in range(2):
                cold = " ".join(f"pair{pair}-doc{k}-w{j}" for j in range(1500))
                req = client.build_request("POST", base + "/v1/chat/completions",
                                           json=_body(cold, "summarise", 2000, stream=True))
                resp = client.send(req, stream=True)
                assert resp.status_code == 200
                opened.append(resp)
            streams += opened
            harness.wait_until(lambda: sum(sim.received()) == 2, 30, what="both cold prompts received")
            assert sim.received() == [1, 1], (pair, sim.received())
            for s in opened:
                s.close()
        router.stop()
    finally:
        for s in streams:
            s.close()
        client.close()
        sim.stop()
