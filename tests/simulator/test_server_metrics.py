"""/metrics of simulated engines: exact vLLM / SGLang names, DP-rank series, lag metrics."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

VLLM_SAMPLES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket", "vllm:lora_requests_info",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "simulator_step_lag_seconds", "simulator_step_lag_max_seconds",
}
SGLANG_SAMPLES = {
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
    "sglang:cache_hit_rate", "sglang:time_to_first_token_seconds_bucket",
    "sglang:inter_token_latency_seconds_bucket", "simulator_step_lag_seconds",
}


def scrape(url: str) -> dict[str, list]:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(samples, name, **labels) -> float:
    vals = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(vals) == 1, (name, labels, vals)
    return vals[0]


def test_vllm_names_and_counts(sim_factory):
    s = sim_factory("--lora", "sql", "--max-loras", "3", "--time-scale", "0.05")
    long_chat = {**CHAT, "messages": [{"role": "user", "content": "the cache " * 40}]}
    for _ in range(3):
        assert httpx.post(s.url(0) + "/v1/chat/completions", json=long_chat).status_code == 200
    m = scrape(s.url(0))
    assert VLLM_SAMPLES <= set(m), VLLM_SAMPLES - set(m)
    assert not any(n.startswith("sglang:") for n in m)
    for samples in m.values():
        for smp in samples:
            assert smp.labels["model_name"] == "demo" and smp.labels["engine"] == "0"
    assert value(m, "vllm:time_to_first_token_seconds_count") == 3
    assert value(m, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == 3
    assert value(m, "vllm:generation_tokens_total") == 12
    assert value(m, "vllm:inter_token_latency_seconds_count") == 9
    # the same prompt three times: queries counted, the repeats hit the prefix cache
    q = value(m, "vllm:prefix_cache_queries_total")
    h = value(m, "vllm:prefix_cache_hits_total")
    assert q > 0 and 0 < h < q
    (lora,) = m["vllm:lora_requests_info"]
    assert lora.labels["max_lora"] == "3" and lora.labels["running_lora_adapters"] == ""
    assert value(m, "vllm:num_requests_running") == 0
    assert value(m, "simulator_step_lag_max_seconds") >= 0


def test_running_lora_and_load_visible_during_a_request(sim_factory):
    s = sim_factory("--lora", "sql", "--time-scale", "1")
    body = {"model": "sql", "prompt": "x", "max_tokens": 100000, "stream": True}
    with httpx.stream("POST", s.url(0) + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # keep the iterator: dropping it closes the response
        next(lines)
        m = scrape(s.url(0))
        assert value(m, "vllm:num_requests_running") == 1
        assert value(m, "vllm:kv_cache_usage_perc") > 0
        assert m["vllm:lora_requests_info"][0].labels["running_lora_adapters"] == "sql"
        assert httpx.get(s.url(0) + "/get_load").json()["load"] == 1
        st = s.state(0)
        assert st["running"] == 1 and st["kv_usage"] > 0 and "lag_seconds" in st
    s.wait_for(lambda: value(scrape(s.url(0)), "vllm:num_requests_running") == 0,
               what="request aborted after disconnect")


def test_sglang_flavour_names(sim_factory):
    s = sim_factory("--flavour", "sglang", "--fast")
    assert httpx.post(s.url(0) + "/v1/chat/completions", json=CHAT).status_code == 200
    m = scrape(s.url(0))
    assert SGLANG_SAMPLES <= set(m), SGLANG_SAMPLES - set(m)
    assert not any(n.startswith("vllm:") for n in m)
    assert value(m, "sglang:time_to_first_token_seconds_count") == 1


def test_dp_ranks_split_series(sim_factory):
    s = sim_factory("--dp-ranks", "2", "--fast")
    for _ in range(4):
        assert httpx.post(s.url(0) + "/v1/chat/completions", json=CHAT).status_code == 200
    m = scrape(s.url(0))
    ranks = {smp.labels["engine"] for smp in m["vllm:num_requests_running"]}
    assert ranks == {"0", "1"}
    per_rank = [value(m, "vllm:time_to_first_token_seconds_count", engine=r) for r in ("0", "1")]
    assert sum(per_rank) == 4 and min(per_rank) >= 1  # both ranks served requests
    st = s.state(0)
    assert [r["rank"] for r in st["ranks"]] == [0, 1]
    assert httpx.get(s.url(0) + "/get_server_info").json()["dp_size"] == 2
