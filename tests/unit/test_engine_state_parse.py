"""Parsing and per-endpoint aggregation of engine /metrics pages (hand-written exposition)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kthena_router.engine_state.metrics_parse import (
    PREFIX_HITS,
    PREFIX_QUERIES,
    TPOT_COUNT,
    TPOT_SUM,
    TTFT_COUNT,
    TTFT_SUM,
    normalize_flavour,
    parse_metrics,
)

VLLM_DP2 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.6
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.9
vllm:gpu_cache_usage_perc{engine="1",model_name="llama"} 0.9
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="llama"} 3000.0
vllm:prefix_cache_queries_created{engine="0",model_name="llama"} 1.75e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 500.0
vllm:prefix_cache_hits_total{engine="1",model_name="llama"} 1500.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="llama"} 6.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="llama"} 4.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_count{engine="0",model_name="llama"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="llama"} 2.0
vllm:inter_token_latency_seconds_count{engine="1",model_name="llama"} 100.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="llama"} 3.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_count{engine="0",model_name="llama"} 7.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="llama"} 70.0
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{engine="0",max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{engine="0",max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="x"} 1.8e+09
vllm:lora_requests_info{engine="1",max_lora="4",running_lora_adapters="chat",waiting_lora_adapters=""} 1.8e+09
"""


def test_vllm_dp_ranks_are_summed_and_kv_is_averaged() -> None:
    p = parse_metrics(VLLM_DP2, "vllm")
    assert (p.running, p.waiting) == (8.0, 3.0)
    # the current name wins over the older one exported alongside
    assert p.kv_usage == pytest.approx(0.4)
    assert p.total[PREFIX_QUERIES] == 4000.0 and p.total[PREFIX_HITS] == 2000.0
    assert (p.total[TTFT_SUM], p.total[TTFT_COUNT]) == (6.0, 10.0)
    # inter_token_latency wins over time_per_output_token, sum and count from one family
    assert (p.total[TPOT_SUM], p.total[TPOT_COUNT]) == (5.0, 200.0)
    assert p.ranks == 2
    assert p.errors == 0
    # per-series values are kept for per-rank deltas; _created and _bucket are not read
    assert p.counters[TTFT_COUNT] == {(("engine", "0"),): 4.0, (("engine", "1"),): 6.0}


def test_lora_info_latest_series_per_rank_union_over_ranks() -> None:
    p = parse_metrics(VLLM_DP2, "vllm")
    assert p.lora is not None
    assert p.lora.running == ("chat", "sql")  # "old" is an earlier, lingering label set
    assert p.lora.waiting == ("x",)
    assert p.lora.max_lora == 4


def test_base_and_adapter_model_names_do_not_double_count() -> None:
    text = """\
vllm:num_requests_running{engine="0",model_name="llama"} 4.0
vllm:num_requests_running{engine="0",model_name="llama-sql-lora"} 4.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
vllm:num_requests_running{engine="1",model_name="llama-sql-lora"} 2.0
vllm:num_requests_waiting{model_name="llama",engine="0"} 1.0
vllm:num_requests_waiting{model_name="llama-sql-lora",engine="0"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama-sql-lora"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama-sql-lora"} 1.0
"""
    p = parse_metrics(text, "vllm")
    assert p.running == 6.0
    assert p.waiting == 1.0
    assert (p.total[TTFT_SUM], p.total[TTFT_COUNT]) == (1.0, 10.0)


def test_older_vllm_names_are_used_when_current_ones_are_absent() -> None:
    text = """\
vllm:num_requests_running{model_name="m"} 2
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{model_name="m"} 4
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.2
"""
    p = parse_metrics(text, "vLLM")
    assert (p.running, p.waiting, p.kv_usage, p.hit_rate) == (2.0, 0.0, 0.75, 0.5)
    assert (p.total[TPOT_SUM], p.total[TPOT_COUNT]) == (0.2, 4.0)
    assert TTFT_COUNT not in p.counters and PREFIX_QUERIES not in p.counters
    assert p.lora is None
    assert p.ranks == 1


def test_sglang_names_and_dp_rank_label() -> None:
    text = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="qwen"} 7.0
sglang:num_running_reqs{dp_rank="1",model_name="qwen"} 1.0
sglang:num_queue_reqs{dp_rank="0",model_name="qwen"} 3.0
sglang:num_queue_reqs{dp_rank="1",model_name="qwen"} 0.0
sglang:token_usage{dp_rank="0",model_name="qwen"} 0.5
sglang:token_usage{dp_rank="1",model_name="qwen"} 0.1
sglang:cache_hit_rate{dp_rank="0",model_name="qwen"} 0.8
sglang:cache_hit_rate{dp_rank="1",model_name="qwen"} 0.4
sglang:time_to_first_token_seconds_sum{dp_rank="0",model_name="qwen"} 3.0
sglang:time_to_first_token_seconds_count{dp_rank="0",model_name="qwen"} 2.0
sglang:inter_token_latency_seconds_sum{dp_rank="0",model_name="qwen"} 1.0
sglang:inter_token_latency_seconds_count{dp_rank="0",model_name="qwen"} 50.0
vllm:num_requests_running{model_name="qwen"} 99.0
"""
    p = parse_metrics(text, "SGLang")
    assert (p.running, p.waiting) == (8.0, 3.0)
    assert p.kv_usage == pytest.approx(0.3)
    assert p.hit_rate == pytest.approx(0.6)
    assert (p.total[TTFT_SUM], p.total[TTFT_COUNT]) == (3.0, 2.0)
    assert (p.total[TPOT_SUM], p.total[TPOT_COUNT]) == (1.0, 50.0)
    assert p.ranks == 2
    # an unknown flavour reads both name sets
    assert normalize_flavour("trtllm") == "any"


def test_kv_usage_is_weighted_by_capacity_when_cache_config_gives_it() -> None:
    text = """\
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="3000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0
"""
    p = parse_metrics(text)
    assert p.kv_usage == pytest.approx(0.75)
    assert (p.num_gpu_blocks, p.block_size) == (4000, 16)


def test_syntax_corners() -> None:
    text = (
        'vllm:num_requests_running{model_name="a \\"quoted\\" } name",engine="0"} 2 1712345678000\r\n'
        "vllm:num_requests_waiting 5\n"
        'vllm:kv_cache_usage_perc{ engine = "0" , model_name="m", } NaN\n'
        'vllm:num_requests_running{engine="1" broken 3\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a\\\\b, c ,",'
        'waiting_lora_adapters=""} 1\n'
        "vllm:num_requests_running_total 100\n"
        "#vllm:num_requests_waiting 100\n"
    )
    p = parse_metrics(text)
    assert p.running == 2.0  # first line (no leading newline), escapes, timestamp, CRLF
    assert p.waiting == 5.0  # no labels
    assert p.kv_usage is not None and math.isnan(p.kv_usage)
    assert p.errors == 1  # the broken line is skipped, not fatal
    assert p.lora is not None and p.lora.running == ("a\\b", "c")


def test_page_without_known_families() -> None:
    p = parse_metrics("# HELP x y\nprocess_cpu_seconds_total 1.0\n", "vllm")
    assert p.samples == 0
    assert (p.running, p.waiting, p.kv_usage, p.lora) == (None, None, None, None)
    assert p.counters == {}


# --- a realistic page, cross-checked against prometheus_client's parser -----------------


def realistic_vllm_page(ranks: int = 2, model: str = "meta-llama/Llama-3.1-8B-Instruct",
                        seed: int = 1) -> str:
    """A vLLM V1-like /metrics page: python/process families, gauges, counters with
    `_created`, cache_config_info and vLLM's ~15 histograms per rank (~40 KB per rank)."""
    rng = random.Random(seed)
    out: list[str] = ["# HELP python_gc_objects_collected_total Objects collected during gc",
                      "# TYPE python_gc_objects_collected_total counter"]
    out += [f'python_gc_objects_collected_total{{generation="{g}"}} {rng.randint(9, 9999)}.0'
            for g in range(3)]
    for n in ("process_virtual_memory_bytes", "process_resident_memory_bytes",
              "process_start_time_seconds", "process_open_fds"):
        out += [f"# HELP {n} x", f"# TYPE {n} gauge", f"{n} {rng.random() * 1e9}"]

    def lb(r: int, extra: str = "") -> str:
        return f'{{engine="{r}",model_name="{model}"{extra}}}'

    def gauge(name: str, value: float) -> None:
        out.extend([f"# HELP {name} help for {name}", f"# TYPE {name} gauge"])
        out.extend(f"{name}{lb(r)} {value + r}" for r in range(ranks))

    def counter(name: str, value: float, extras: tuple[str, ...] = ("",)) -> None:
        out.extend([f"# HELP {name}_total help for {name}", f"# TYPE {name}_total counter"])
        for r in range(ranks):
            for e in extras:
                out.append(f"{name}_total{lb(r, e)} {value + r}")
                out.append(f"{name}_created{lb(r, e)} 1.7512345678901234e+09")

    def hist(name: str, buckets: list[float], scale: float) -> None:
        out.extend([f"# HELP {name} Histogram of {name}", f"# TYPE {name} histogram"])
        for r in range(ranks):
            cum = 0
            for b in buckets:
                cum += rng.randint(0, 50)
                le = ',le="' + str(float(b)) + '"'
                out.append(f"{name}_bucket{lb(r, le)} {float(cum)}")
            inf = ',le="+Inf"'
            out.append(f"{name}_bucket{lb(r, inf)} {float(cum)}")
            out.append(f"{name}_count{lb(r)} {float(cum)}")
            out.append(f"{name}_sum{lb(r)} {cum * scale * rng.random()}")
            out.append(f"{name}_created{lb(r)} 1.7512345678901234e+09")

    gauge("vllm:num_requests_running", 3)
    gauge("vllm:num_requests_waiting", 1)
    gauge("vllm:kv_cache_usage_perc", 0.25)
    out += ["# TYPE vllm:lora_requests_info gauge"]
    out += [f'vllm:lora_requests_info{{engine="{r}",max_lora="4",running_lora_adapters="a{r},b",'
            f'waiting_lora_adapters=""}} 1.75e+09' for r in range(ranks)]
    out += ["# TYPE vllm:cache_config_info gauge"]
    out += [f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
            f'engine="{r}",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000",'
            f'prefix_caching_hash_algo="builtin",sliding_window="None",swap_space="4"}} 1.0'
            for r in range(ranks)]
    counter("vllm:num_preemptions", 2)
    counter("vllm:prompt_tokens", 123456)
    counter("vllm:generation_tokens", 654321)
    counter("vllm:prefix_cache_queries", 100000)
    counter("vllm:prefix_cache_hits", 40000)
    counter("vllm:request_success", 77, (',finished_reason="stop"', ',finished_reason="length"',
                                         ',finished_reason="abort"'))
    toks = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
    lat = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
    ttft = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    itl = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
           10.0, 20.0, 40.0, 80.0]
    hist("vllm:iteration_tokens_total", [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], 100)
    hist("vllm:time_to_first_token_seconds", ttft, 0.1)
    hist("vllm:time_per_output_token_seconds", itl, 0.02)
    hist("vllm:inter_token_latency_seconds", itl, 0.02)
    for n in ("e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_inference_time_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds"):
        hist(f"vllm:{n}", lat, 2.0)
    for n in ("request_prompt_tokens", "request_generation_tokens",
              "request_max_num_generation_tokens", "request_params_max_tokens"):
        hist(f"vllm:{n}", toks, 300)
    return "\n".join(out) + "\n"


def _reference(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_realistic_page_agrees_with_prometheus_client(ranks: int) -> None:
    text = realistic_vllm_page(ranks)
    ref = _reference(text)

    def total(name: str) -> float:
        return sum(v for _, v in ref[name])

    p = parse_metrics(text, "vllm")
    assert p.errors == 0
    assert p.running == total("vllm:num_requests_running")
    assert p.waiting == total("vllm:num_requests_waiting")
    assert p.kv_usage == pytest.approx(total("vllm:kv_cache_usage_perc") / ranks)
    assert p.total[PREFIX_QUERIES] == total("vllm:prefix_cache_queries_total")
    assert p.total[PREFIX_HITS] == total("vllm:prefix_cache_hits_total")
    assert p.total[TTFT_SUM] == pytest.approx(total("vllm:time_to_first_token_seconds_sum"))
    assert p.total[TTFT_COUNT] == total("vllm:time_to_first_token_seconds_count")
    assert p.total[TPOT_SUM] == pytest.approx(total("vllm:inter_token_latency_seconds_sum"))
    assert p.total[TPOT_COUNT] == total("vllm:inter_token_latency_seconds_count")
    assert p.num_gpu_blocks == 27000 * ranks
    assert p.ranks == ranks
    assert p.lora is not None and p.lora.running == tuple(sorted({"b", *(f"a{r}" for r in range(ranks))}))
    assert len(text) > 35_000 * ranks  # the page is as large as a real one


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500),
                          st.floats(0, 1, allow_nan=False), st.sampled_from(["0", "1", "2", "3"])),
                min_size=1, max_size=4, unique_by=lambda t: t[3]),
       st.booleans())
def test_any_rank_split_sums_like_the_reference(rows: list[tuple[int, int, float, str]],
                                                shuffle: bool) -> None:
    lines = []
    for running, waiting, kv, rank in rows:
        lines += [f'vllm:num_requests_running{{engine="{rank}",model_name="m"}} {running}',
                  f'vllm:num_requests_waiting{{model_name="m",engine="{rank}"}} {waiting}',
                  f'vllm:kv_cache_usage_perc{{engine="{rank}",model_name="m"}} {kv!r}']
    if shuffle:
        random.Random(len(lines)).shuffle(lines)
    p = parse_metrics("\n".join(lines), "vllm")
    assert p.running == sum(r[0] for r in rows)
    assert p.waiting == sum(r[1] for r in rows)
    assert p.kv_usage == pytest.approx(sum(r[2] for r in rows) / len(rows))
    assert p.ranks == len(rows)
