"""prefix-cache's evictedHintSlots through a real router and engine simulators: a prefix the
router's (deliberately tiny) index has dropped still goes back to the engine that served
it, which still caches it; without hints the same requests land wherever the tie-break
sends them. Sequential requests on idle engines; prefix-cache weighs 3 against
least-request's 1 because a scrape that overlaps a request's end can show one running
request for a while, and at equal weights that outweighs a hint's half-weight match."""

from __future__ import annotations

from pathlib import Path

import httpx

import harness

CACHE = 20  # index entries per endpoint: a 60-block prompt keeps only its first 20
# Without hints every group must not return by chance: (1/3)^10 that all do, and (2/3)^24
# that some engine got no filler (its index kept its groups).
GROUPS = 10
FILLERS = 24


def config(hints: bool) -> str:
    args = f"{{maxHashCacheSize: {CACHE}, evictedHintSlots: {4096 if hints else 0}}}"
    return ("scheduler:\n  pluginConfig:\n  - name: prefix-cache\n    args: " + args + "\n"
            "  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 3}\n"
            "      - {name: least-request, weight: 1}\n")


def prompt(tag: str) -> str:
    # ~3900 bytes = ~60 blocks of 64 bytes, distinct from the first block on
    return f"{tag}: " + " ".join(f"{tag}{i}" for i in range(650))[:3900]


def served_by(sim: harness.Simulator, client, text: str) -> int:
    sim.reset_requests()
    client.completions.create(model="demo", prompt=text, max_tokens=2)
    got = sim.received()
    assert sorted(got) == [0] * (len(got) - 1) + [1], got
    return got.index(1)


def test_evicted_prefix_returns_to_its_engine(tmp_path: Path) -> None:
    sim = harness.start_simulator(tmp_path, 3, extra_args=["--time-scale", "1"])
    try:
        config_path = harness.write_config(tmp_path / "router.yaml", harness.engine_config(sim.ports))
        routers = {}
        for hints in (False, True):
            sched = tmp_path / f"sched-{hints}.yaml"
            sched.write_text(config(hints))
            routers[hints] = harness.start_router(config_path, tmp_path, extra_args=[
                "--router-config", str(sched), "--scrape-interval-s", "0.3", "--health-probe-interval-s", "600"])

        def scraped(r: harness.Router) -> bool:
            fams = harness.parse_metrics(r.metrics_text())
            return all(harness.metric_value(fams, "kthena_router_endpoint_metrics_stale",
                                            endpoint=f"127.0.0.1:{p}") == 0 for p in sim.ports)

        for r in routers.values():
            harness.wait_until(lambda r=r: scraped(r), 30, interval=0.1, what="every engine scraped and fresh")
        report: dict[bool, list[tuple[int, int]]] = {}
        for hints, router in routers.items():
            for url in sim.urls:
                httpx.post(url + "/flush_cache", timeout=10).raise_for_status()
            client = router.openai()
            groups = [f"g{hints}{k}" for k in range(GROUPS)]
            first = {g: served_by(sim, client, prompt(g)) for g in groups}
            # fillers: each one landing on an engine flushes that engine's 20-entry index
            for k in range(FILLERS):
                served_by(sim, client, prompt(f"filler{hints}{k}"))
            report[hints] = [(first[g], served_by(sim, client, prompt(g))) for g in groups]
        for r in routers.values():
            r.stop()
        # With hints every group returns to its first engine (it is still cached there).
        assert all(a == b for a, b in report[True]), report
        # Without hints the tiny index forgot some of them (the request-id tie-break sends a
        # forgotten group to its first engine with probability 1/3 per group, all 10: 2e-5).
        assert any(a != b for a, b in report[False]), report
    finally:
        sim.stop()
