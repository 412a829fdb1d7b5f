"""Conditional disaggregation (pd.minUncachedTokens) on both sides of the threshold, and the
prefill hop's own timeout (pd.servers.<name>.prefillTimeout), through the real router, the
simulator's prefill/decode engines (NIXL) and the OpenAI SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import harness
import openai
import pd_harness as pdh
import pytest
import yaml

THRESHOLD = 200  # tokens


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    with harness.start_simulator(tmp_path_factory.mktemp("pd-cond-sim"), engines=2, fast=True,
                                 extra_args=["--roles", "prefill,decode"]) as s:
        yield s


@pytest.fixture(scope="module")
def router(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work: Path = tmp_path_factory.mktemp("pd-cond-router")
    labels = {"app": "pd"}
    docs = [harness.route_doc("cond", "cond", "cond"), pdh.pd_server("cond", labels, connector="nixl"),
            harness.route_doc("slow", "slow", "slow"), pdh.pd_server("slow", labels, connector="nixl", retry_attempts=0),
            pdh.endpoints("engines", [(sim.ports[0], {**labels, "group": "g", "role": "prefill"}, None),
                                      (sim.ports[1], {**labels, "group": "g", "role": "decode"}, None)])]
    config = harness.write_config(work / "routes.yaml", docs)
    rc = work / "router.yaml"
    rc.write_text(yaml.safe_dump({"pd": {"minUncachedTokens": THRESHOLD,
                                         "servers": {"slow": {"prefillTimeout": "500ms", "minUncachedTokens": 0}}}}))
    with harness.start_router(config, work, workers=1, extra_args=["--router-config", str(rc)]) as r:
        yield r


def _modes(router: harness.Router, server: str) -> tuple[float, float]:
    return (pdh.metric(router, "kthena_router_pd_requests_total", model_server=server, mode="two_hop"),
            pdh.metric(router, "kthena_router_pd_requests_total", model_server=server, mode="decode_only"))


def test_short_uncached_tail_goes_to_decode_alone_and_a_new_prompt_takes_two_hops(
        router: harness.Router, sim: harness.Simulator) -> None:
    client = router.openai()
    history = [{"role": "user", "content": "Summarise the history of the printing press in detail. " * 40}]
    r = client.chat.completions.create(model="cond", messages=history, max_tokens=4)
    assert r.usage is not None and r.usage.prompt_tokens > 4 * THRESHOLD  # far over the threshold
    assert _modes(router, "default/cond") == (1, 0)
    assert sim.requests(0)["received"] == 1  # the prefill engine ran it

    # a follow-up: the decode engine holds the conversation so far; only a short tail is new
    history += [{"role": "assistant", "content": r.choices[0].message.content or "ok"},
                {"role": "user", "content": "And in Asia?"}]
    stream = client.chat.completions.create(model="cond", messages=history, max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert _modes(router, "default/cond") == (1, 1)
    assert sim.requests(0)["received"] == 1 and sim.requests(1)["completed"] == 2  # no prefill hop

    # a new conversation: everything uncached, two hops again
    fresh = [{"role": "user", "content": "Explain how tides work, with every detail you know. " * 40}]
    r = client.chat.completions.create(model="cond", messages=fresh, max_tokens=4)
    assert r.choices[0].message.content
    assert _modes(router, "default/cond") == (2, 1)
    assert sim.requests(0)["received"] == 2


def test_prefill_over_its_timeout_fails_the_request_without_a_decode(router: harness.Router,
                                                                    sim: harness.Simulator) -> None:
    sim.reset_requests()
    sim.set_faults(0, first_byte_delay_s=3.0)
    try:
        with pytest.raises(openai.APIStatusError) as ei:
            router.openai(max_retries=0).chat.completions.create(
                model="slow", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert ei.value.status_code == 504, ei.value.body
        assert "prefill" in str(ei.value.body)
        assert sim.requests(1)["received"] == 0  # the decode never ran
        assert pdh.metric(router, "kthena_router_pd_hop_failures_total", model_server="default/slow",
                          side="prefill", reason="timeout") == 1
    finally:
        sim.reset_faults()
