"""The router's signals for the autoscaler (docs/autoscaler.md `router:` metrics):
kthena_router_endpoint_tokens_total and kthena_router_endpoint_kv_cache_usage, against real
simulator engines, a real router with two workers and the openai SDK."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness

TOKENS = "kthena_router_endpoint_tokens_total"
KV = "kthena_router_endpoint_kv_cache_usage"
ROUTER_CONFIG = "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: least-request, weight: 1}\n"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    # a small KV cache, so a few long prompts give a visible usage
    with harness.start_simulator(tmp_path_factory.mktemp("signals-sim"), engines=2,
                                 extra_args=["--kv-blocks", "256", "--block-size", "16", "--seed", "5"]) as s:
        yield s


@pytest.fixture(scope="module")
def router(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    tmp = tmp_path_factory.mktemp("signals-router")
    config = harness.write_config(tmp / "cfg" / "routes.yaml", harness.engine_config(sim.ports))
    rc = tmp / "router-config.yaml"
    rc.write_text(ROUTER_CONFIG)
    with harness.start_router(config, tmp, workers=2,
                              extra_args=["--router-config", str(rc), "--scrape-interval-s", "0.2"]) as r:
        yield r


def _samples(router: harness.Router, name: str) -> dict[tuple[str, ...], float]:
    fams = harness.parse_metrics(router.metrics_text())
    out: dict[tuple[str, ...], float] = {}
    for fam in fams.values():
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value  # type: ignore[arg-type]
    return out


def _tokens(router: harness.Router, endpoint: str, token_type: str) -> float:
    fams = harness.parse_metrics(router.metrics_text())
    return harness.metric_value(fams, TOKENS, model_server="default/demo", endpoint=endpoint, token_type=token_type)


def test_endpoint_tokens_match_the_usage_of_the_requests(router: harness.Router, sim: harness.Simulator) -> None:
    eps = [f"127.0.0.1:{p}" for p in sim.ports]
    before = {(ep, t): _tokens(router, ep, t) for ep in eps for t in ("input", "output")}
    sim.reset_requests()
    client = router.openai()
    prompt_total = completion_total = 0
    n = 12
    prompt = "count the tokens of this prompt " * 5
    for i in range(n):
        if i % 2:
            r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                               max_tokens=3 + i)
            usage = r.usage
        else:  # streamed: the router injects include_usage and hides the chunk, but counts it
            usage = None
            stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=3 + i, stream=True,
                                                    stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
        assert usage is not None
        prompt_total += usage.prompt_tokens
        completion_total += usage.completion_tokens
    # every request had the same prompt, so an engine's input is its request count x that size
    per_prompt = prompt_total // n
    assert per_prompt * n == prompt_total
    served = [sim.requests(i) for i in range(len(sim.ports))]
    expected_in = {ep: per_prompt * sum(1 for e in s["log"] if e["status"] == "completed")
                   for ep, s in zip(eps, served)}
    expected_out = {ep: sum(e["tokens_out"] for e in s["log"] if e["status"] == "completed")
                    for ep, s in zip(eps, served)}
    assert sum(expected_out.values()) == completion_total
    assert all(v > 0 for v in expected_in.values()), "both engines should have served requests"

    def counted() -> bool:
        return all(_tokens(router, ep, "input") - before[(ep, "input")] == expected_in[ep]
                   and _tokens(router, ep, "output") - before[(ep, "output")] == expected_out[ep] for ep in eps)

    harness.wait_until(counted, 10, what="per-endpoint token counters")


def test_a_long_stream_counts_its_output_while_it_runs(router: harness.Router, sim: harness.Simulator) -> None:
    eps = [f"127.0.0.1:{p}" for p in sim.ports]

    def output() -> float:
        return sum(_tokens(router, ep, "output") for ep in eps)

    before = output()
    sim.reset_requests()
    for i in range(len(sim.ports)):
        sim.set_faults(i, token_delay_s=0.2)  # 20 tokens: about 4 s of stream
    done = threading.Event()

    def consume() -> None:
        stream = router.openai(timeout=60.0).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "tell a long story"}], max_tokens=20, stream=True)
        for _ in stream:
            pass
        done.set()

    t = threading.Thread(target=consume, daemon=True)
    try:
        t.start()
        harness.wait_until(lambda: output() > before or done.is_set(), 30, what="output counted")
        assert not done.is_set(), "the output was counted only when the stream ended"
        t.join(60)
        assert done.is_set()
    finally:
        sim.reset_faults()
    # the final usage settles the count: the engine's own token count, not more
    served = sum(e["tokens_out"] for i in range(len(sim.ports)) for e in sim.requests(i)["log"]
                 if e["status"] == "completed")
    assert served == 20
    harness.wait_until(lambda: output() - before == served, 10, what="output settled to the usage")


def _hold_long_stream(router: harness.Router, stop: threading.Event) -> None:
    client = router.openai(timeout=120.0)
    stream = client.completions.create(model="demo", prompt="a long prompt to fill the cache " * 200,
                                       max_tokens=4000, stream=True)
    for _ in stream:
        if stop.is_set():
            stream.close()
            return


def test_kv_usage_gauge_is_the_engines_own_and_leaves_with_the_endpoint(
        router: harness.Router, sim: harness.Simulator, tmp_path: Path) -> None:
    eps = [f"127.0.0.1:{p}" for p in sim.ports]

    def gauges() -> dict[str, float]:
        return {dict(k)["endpoint"]: v for k, v in _samples(router, KV).items()
                if dict(k).get("model_server") == "default/demo"}

    harness.wait_until(lambda: set(gauges()) == set(eps), 20, what="a KV-usage series per endpoint")
    # engines slowed to a crawl keep their KV usage still while we compare
    for i in range(len(sim.ports)):
        sim.set_faults(i, token_delay_s=0.5)
    stop = threading.Event()
    threads = [threading.Thread(target=_hold_long_stream, args=(router, stop), daemon=True) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        truth = lambda: [float(sim.state(i)["kv_usage"]) for i in range(len(sim.ports))]  # noqa: E731
        harness.wait_until(lambda: sum(truth()) > 0.1, 30, what="the engines using KV cache")

        def agrees() -> bool:
            g = gauges()
            # 2 workers each publish the same value: livemax, never a sum over workers
            return all(ep in g and abs(g[ep] - u) < 0.03 for ep, u in zip(eps, truth()))

        harness.wait_until(agrees, 20, what=f"the KV gauge equal to the engines' usage ({truth()})")
        assert all(0.0 <= v <= 1.0 for v in gauges().values())
    finally:
        stop.set()
        for i in range(len(sim.ports)):
            sim.reset_faults(i)
        for t in threads:
            t.join(30)
    # the second endpoint leaves the ModelServer: its series goes away (not 0, not the last value)
    harness.write_config(router.config_path, harness.engine_config(sim.ports[:1]))
    assert router.reload().status_code == 200
    harness.wait_until(lambda: set(gauges()) == {eps[0]}, 20, what="the gone endpoint's KV series removed")
