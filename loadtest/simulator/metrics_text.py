"""Prometheus text exposition of engine snapshots, with vLLM's or SGLang's metric names.

Rendered by hand (no registry): every scrape reads fresh snapshots, and the output
follows prometheus_client's format (HELP/TYPE, counters named with `_total`,
histograms with cumulative `_bucket{le=...}`, `_sum`, `_count`). Every series carries
`model_name` and `engine` (the DP rank, "0" with one rank, as vLLM V1 does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class RankView:
    """What one DP rank contributes to /metrics."""

    rank: int
    snap: Any  # EngineSnapshot (engine.py) or its FastEngine twin


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in d.items()) + "}"


def _num(v: float) -> str:
    return repr(float(v))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_num(value)}")

    def gauge(self, name: str, help_: str, views, base, fn) -> None:
        self.family(name, "gauge", help_)
        for v in views:
            self.sample(name, base(v), fn(v.snap))

    def counter(self, name: str, help_: str, views, base, fn) -> None:
        # prometheus_client names the family and the sample `<name>_total`
        self.family(name + "_total", "counter", help_)
        for v in views:
            self.sample(name + "_total", base(v), fn(v.snap))

    def histogram(self, name: str, help_: str, views, base, fn) -> None:
        self.family(name, "histogram", help_)
        for v in views:
            h = fn(v.snap)
            lb = base(v)
            for le, c in zip(h.buckets, h.counts, strict=True):
                self.sample(name + "_bucket", {**lb, "le": _num(le)}, c)
            self.sample(name + "_bucket", {**lb, "le": "+Inf"}, h.count)
            self.sample(name + "_count", lb, h.count)
            self.sample(name + "_sum", lb, h.sum)


def render(flavour: str, model: str, views: Sequence[RankView], max_loras: int) -> bytes:
    out = _Out()

    def base(v: RankView) -> dict[str, str]:
        return {"engine": str(v.rank), "model_name": model}

    if flavour == "sglang":
        _sglang(out, views, base)
    else:
        _vllm(out, views, base, max_loras)
    _simulator(out, views, base)
    out.lines.append("")
    return "\n".join(out.lines).encode()


def _vllm(out: _Out, views, base, max_loras: int) -> None:
    out.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
              views, base, lambda s: s.running)
    out.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
              views, base, lambda s: s.waiting)
    out.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
              views, base, lambda s: s.kv_usage)
    out.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (older name).",
              views, base, lambda s: s.kv_usage)
    out.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                "queried tokens.", views, base, lambda s: s.prefix_queries_total)
    out.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                "tokens.", views, base, lambda s: s.prefix_hits_total)
    out.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                views, base, lambda s: s.preemptions_total)
    out.counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                views, base, lambda s: s.prompt_tokens_total)
    out.counter("vllm:generation_tokens", "Number of generation tokens processed.",
                views, base, lambda s: s.generation_tokens_total)
    out.counter("vllm:request_success", "Count of finished requests (including aborted).",
                views, lambda v: {**base(v), "finished_reason": "length"},
                lambda s: s.requests_finished_total)
    out.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in "
                  "seconds.", views, base, lambda s: s.ttft)
    out.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in "
                  "seconds.", views, base, lambda s: s.itl)
    out.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token "
                  "in seconds (older name).", views, base, lambda s: s.itl)
    out.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in "
                  "seconds.", views, base, lambda s: s.e2e)
    # vLLM's engine config as an info gauge (value 1): the router sizes its index from it
    out.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    for v in views:
        out.sample("vllm:cache_config_info", {
            **base(v), "block_size": str(v.snap.block_size),
            "num_gpu_blocks": str(v.snap.num_gpu_blocks), "enable_prefix_caching": "True",
            "cache_dtype": "auto", "gpu_memory_utilization": "0.9",
        }, 1.0)
    out.family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
    for v in views:
        out.sample("vllm:lora_requests_info", {
            **base(v),
            "max_lora": str(max_loras),
            "running_lora_adapters": ",".join(v.snap.running_loras),
            "waiting_lora_adapters": ",".join(v.snap.waiting_loras),
        }, 1.0)


def _sglang(out: _Out, views, base) -> None:
    def hit_rate(s) -> float:
        return s.prefix_hits_total / s.prefix_queries_total if s.prefix_queries_total else 0.0

    out.gauge("sglang:num_running_reqs", "The number of running requests.",
              views, base, lambda s: s.running)
    out.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
              views, base, lambda s: s.waiting)
    out.gauge("sglang:token_usage", "The token usage.", views, base, lambda s: s.kv_usage)
    out.gauge("sglang:num_used_tokens", "The number of used tokens.", views, base,
              lambda s: round(s.kv_usage * s.num_gpu_blocks * s.block_size))
    out.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", views, base, hit_rate)
    out.counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                views, base, lambda s: s.prompt_tokens_total)
    out.counter("sglang:generation_tokens", "Number of generation tokens processed.",
                views, base, lambda s: s.generation_tokens_total)
    out.counter("sglang:num_requests", "Number of requests processed.",
                views, base, lambda s: s.requests_finished_total)
    out.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in "
                  "seconds.", views, base, lambda s: s.ttft)
    out.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in "
                  "seconds.", views, base, lambda s: s.itl)
    out.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request "
                  "latency in seconds", views, base, lambda s: s.e2e)


def _simulator(out: _Out, views, base) -> None:
    out.gauge("simulator_step_lag_seconds", "Simulator: how late the step loop woke at its "
              "last step (simulated seconds).", views, base, lambda s: s.lag_seconds)
    out.gauge("simulator_step_lag_max_seconds", "Simulator: maximum step-loop lag since start.",
              views, base, lambda s: s.lag_max_seconds)
    out.counter("simulator_steps", "Simulator: engine steps run.", views, base,
                lambda s: s.steps_total)
    out.gauge("simulator_busy_fraction", "Simulator: fraction of simulated time spent in steps.",
              views, base, lambda s: s.busy_fraction)
    out.gauge("simulator_kv_cached_free_blocks", "Simulator: free KV blocks still holding a "
              "cached prefix.", views, base, lambda s: s.cached_free_blocks)
    out.gauge("simulator_kv_num_gpu_blocks", "Simulator: KV cache capacity in blocks.",
              views, base, lambda s: s.num_gpu_blocks)
