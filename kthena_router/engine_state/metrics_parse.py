"""Targeted parser for the engine /metrics families the router reads (vLLM and SGLang).

Why not prometheus_client.parser: on a realistic vLLM page with 2 DP ranks (73 KiB, ~700
lines, `realistic_vllm_page` in tests/unit/test_engine_state_parse.py)
`text_string_to_metric_families` costs 11.3 ms (pure Python, every bucket of every
histogram); this parser costs 0.21 ms (4 ranks, 143 KiB: 22.4 ms vs 0.40 ms; best of 5 on
the shared dev box). At a 1 s interval over a few hundred endpoints the library would take
several cores' worth of the router's event loop. Here one regex (literal "\n" + the exact
wanted sample names) finds the wanted lines; only those (~13 per rank) are tokenised.

Aggregation per endpoint (one /metrics page = one engine, possibly several DP ranks):
- A series is identified by its labels minus `model_name`. vLLM labels each gauge with the
  served model name, and one scheduler serves the base model and all its adapters, so
  series of one rank that differ only in `model_name` describe the same queue: they are
  collapsed by max, never summed (no double counting of base + adapters).
- running / waiting / counters / histogram _sum and _count: summed over series (DP ranks).
- KV usage and SGLang's cache_hit_rate: mean over series. When vLLM's cache_config_info
  gives `num_gpu_blocks` for every rank, KV usage is weighted by capacity instead (ranks
  normally have equal capacity, so the mean is the same then).
- Counters and histograms are also returned per series, so that the snapshot can take
  deltas per series: a restart of one rank must not hide behind another rank's growth.
- When both the current and an older name are exported (vLLM exports kv_cache_usage_perc
  and gpu_cache_usage_perc for a while), only the current one is used.
- vllm:lora_requests_info is a gauge whose value is the time it was set; stale label sets
  linger, so the series with the highest value per rank is the current one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SeriesKey = tuple[tuple[str, str], ...]

# logical quantity names
RUNNING = "running"
WAITING = "waiting"
KV_USAGE = "kv_usage"
HIT_RATE = "hit_rate"  # a gauge: SGLang's cache_hit_rate, vLLM v0's gpu_prefix_cache_hit_rate
PREFIX_QUERIES = "prefix_queries"
PREFIX_HITS = "prefix_hits"
TTFT_SUM = "ttft_sum"
TTFT_COUNT = "ttft_count"
TPOT_SUM = "tpot_sum"
TPOT_COUNT = "tpot_count"
LORA_INFO = "lora_info"
CACHE_CONFIG = "cache_config"

COUNTERS = (PREFIX_QUERIES, PREFIX_HITS, TTFT_SUM, TTFT_COUNT, TPOT_SUM, TPOT_COUNT)

# sample name -> (quantity, preference: 0 = current name, 1 = older name)
_VLLM: dict[str, tuple[str, int]] = {
    "vllm:num_requests_running": (RUNNING, 0),
    "vllm:num_requests_waiting": (WAITING, 0),
    "vllm:kv_cache_usage_perc": (KV_USAGE, 0),
    "vllm:gpu_cache_usage_perc": (KV_USAGE, 1),
    "vllm:gpu_prefix_cache_hit_rate": (HIT_RATE, 1),
    "vllm:prefix_cache_queries_total": (PREFIX_QUERIES, 0),
    "vllm:prefix_cache_hits_total": (PREFIX_HITS, 0),
    "vllm:time_to_first_token_seconds_sum": (TTFT_SUM, 0),
    "vllm:time_to_first_token_seconds_count": (TTFT_COUNT, 0),
    "vllm:inter_token_latency_seconds_sum": (TPOT_SUM, 0),
    "vllm:inter_token_latency_seconds_count": (TPOT_COUNT, 0),
    "vllm:time_per_output_token_seconds_sum": (TPOT_SUM, 1),
    "vllm:time_per_output_token_seconds_count": (TPOT_COUNT, 1),
    "vllm:lora_requests_info": (LORA_INFO, 0),
    "vllm:cache_config_info": (CACHE_CONFIG, 0),
}
_SGLANG: dict[str, tuple[str, int]] = {
    "sglang:num_running_reqs": (RUNNING, 0),
    "sglang:num_queue_reqs": (WAITING, 0),
    "sglang:token_usage": (KV_USAGE, 0),
    "sglang:cache_hit_rate": (HIT_RATE, 0),
    "sglang:time_to_first_token_seconds_sum": (TTFT_SUM, 0),
    "sglang:time_to_first_token_seconds_count": (TTFT_COUNT, 0),
    "sglang:inter_token_latency_seconds_sum": (TPOT_SUM, 0),
    "sglang:inter_token_latency_seconds_count": (TPOT_COUNT, 0),
    "sglang:time_per_output_token_seconds_sum": (TPOT_SUM, 1),
    "sglang:time_per_output_token_seconds_count": (TPOT_COUNT, 1),
}
_TABLES = {"vllm": _VLLM, "sglang": _SGLANG, "any": {**_VLLM, **_SGLANG}}
# A wanted line starts with the exact sample name followed by "{" or " ". A literal "\n"
# first lets the regex engine skip to candidate lines with a fast search (faster than `^`
# with re.M, or than str.startswith(tuple) on every line: docs/architecture.md).
_LINES = {
    k: re.compile("\n(?:" + "|".join(re.escape(n) for n in sorted(t, key=len, reverse=True))
                  + ")[{ ][^\n]*")
    for k, t in _TABLES.items()
}

_RANK_LABELS = ("engine", "dp_rank")
_MODEL_LABEL = "model_name"
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=\}))')


def normalize_flavour(flavour: str | None) -> str:
    """'vLLM' / 'SGLang' (ModelServer.inference_engine) or lower case -> table key."""
    f = (flavour or "").lower()
    return f if f in _TABLES else "any"


@dataclass(frozen=True, slots=True)
class LoraInfo:
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    max_lora: int | None


@dataclass(frozen=True, slots=True)
class ParsedMetrics:
    """One page, aggregated per endpoint. None = family absent from the page."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    hit_rate: float | None
    counters: dict[str, dict[SeriesKey, float]]  # quantity -> series -> value (see COUNTERS)
    lora: LoraInfo | None
    num_gpu_blocks: int | None  # summed over ranks, from cache_config_info
    block_size: int | None
    ranks: int  # distinct DP ranks seen on the running/waiting gauges (1 without rank labels)
    samples: int = 0  # lines tokenised (for tests and cost accounting)
    errors: int = 0  # wanted lines that did not parse (skipped)
    total: dict[str, float] = field(default_factory=dict)  # counters summed over series


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return v.replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")


def _parse_line(line: str) -> tuple[str, dict[str, str], float]:
    """`name{a="b",...} value [timestamp]` -> (name, labels, value); raises ValueError."""
    brace = line.find("{")
    space = line.find(" ")
    labels: dict[str, str] = {}
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        pos = brace + 1
        while True:
            # skip blanks; "}" ends the label set
            while pos < len(line) and line[pos] == " ":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            m = _LABEL.match(line, pos)
            if m is None:
                raise ValueError(f"bad label set in {line[:120]!r}")
            labels[m.group(1)] = _unescape(m.group(2))
            pos = m.end()
        rest = line[pos:]
    else:
        name = line[:space]
        rest = line[space:]
    parts = rest.split()
    if not parts:
        raise ValueError(f"no value in {line[:120]!r}")
    return name, labels, float(parts[0])


def _series_key(labels: dict[str, str]) -> SeriesKey:
    if not labels:
        return ()
    if len(labels) == 2 and _MODEL_LABEL in labels:  # the common case: engine + model_name
        return tuple((k, v) for k, v in labels.items() if k != _MODEL_LABEL)
    return tuple(sorted((k, v) for k, v in labels.items() if k != _MODEL_LABEL))


def _rank_of(labels: dict[str, str]) -> str:
    for k in _RANK_LABELS:
        v = labels.get(k)
        if v is not None:
            return v
    return ""


def _split_csv(v: str) -> tuple[str, ...]:
    return tuple(sorted({s.strip() for s in v.split(",") if s.strip()}))


def _int_or_none(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(float(v))
    except ValueError:
        return None


def parse_metrics(text: str, flavour: str | None = "vllm") -> ParsedMetrics:
    """Parse one engine's /metrics page (Prometheus text format 0.0.4)."""
    key = normalize_flavour(flavour)
    table = _TABLES[key]
    lines = _LINES[key]
    # quantity -> preference -> series -> value (collapsed over model_name by max)
    found: dict[str, dict[int, dict[SeriesKey, float]]] = {}
    lora_best: dict[str, tuple[float, dict[str, str]]] = {}  # rank -> (value, labels)
    cache_cfg: dict[str, dict[str, str]] = {}  # rank -> labels
    samples = errors = 0
    for m in lines.finditer("\n" + text):
        samples += 1
        try:
            name, labels, value = _parse_line(m.group()[1:].rstrip("\r"))
        except ValueError:
            errors += 1
            continue
        quantity, pref = table[name]
        if quantity == LORA_INFO:
            rank = _rank_of(labels)
            cur = lora_best.get(rank)
            if cur is None or value >= cur[0]:
                lora_best[rank] = (value, labels)
            continue
        if quantity == CACHE_CONFIG:
            cache_cfg[_rank_of(labels)] = labels
            continue
        series = found.setdefault(quantity, {}).setdefault(pref, {})
        sk = _series_key(labels)
        old = series.get(sk)
        if old is None or value > old:
            series[sk] = value

    def pick(quantity: str) -> dict[SeriesKey, float] | None:
        by_pref = found.get(quantity)
        if not by_pref:
            return None
        return by_pref[min(by_pref)]

    def pick_pair(sum_q: str, count_q: str) -> tuple[dict[SeriesKey, float], dict[SeriesKey, float]]:
        # _sum and _count must come from the same family name
        counts = found.get(count_q, {})
        sums = found.get(sum_q, {})
        for pref in sorted(counts):
            if pref in sums:
                return sums[pref], counts[pref]
        return {}, {}

    def total(series: dict[SeriesKey, float] | None) -> float | None:
        return None if series is None else sum(series.values())

    def mean(series: dict[SeriesKey, float] | None) -> float | None:
        return None if not series else sum(series.values()) / len(series)

    running = pick(RUNNING)
    waiting = pick(WAITING)
    kv = pick(KV_USAGE)
    blocks_by_rank = {r: _int_or_none(lb.get("num_gpu_blocks")) for r, lb in cache_cfg.items()}
    kv_usage = mean(kv)
    if kv and blocks_by_rank and all(b for b in blocks_by_rank.values()):
        weights = {sk: blocks_by_rank.get(_rank_of(dict(sk))) for sk in kv}
        if all(w for w in weights.values()):
            wsum = sum(w for w in weights.values() if w)
            kv_usage = sum(v * (weights[sk] or 0) for sk, v in kv.items()) / wsum

    counters: dict[str, dict[SeriesKey, float]] = {}
    for q in (PREFIX_QUERIES, PREFIX_HITS):
        s = pick(q)
        if s is not None:
            counters[q] = s
    for sq, cq in ((TTFT_SUM, TTFT_COUNT), (TPOT_SUM, TPOT_COUNT)):
        s, c = pick_pair(sq, cq)
        if c:
            counters[sq], counters[cq] = s, c

    lora: LoraInfo | None = None
    if lora_best:
        run: set[str] = set()
        wait: set[str] = set()
        max_loras: list[int] = []
        for _, lb in lora_best.values():
            run.update(_split_csv(lb.get("running_lora_adapters", "")))
            wait.update(_split_csv(lb.get("waiting_lora_adapters", "")))
            m = _int_or_none(lb.get("max_lora"))
            if m is not None:
                max_loras.append(m)
        lora = LoraInfo(tuple(sorted(run)), tuple(sorted(wait)), max(max_loras) if max_loras else None)

    num_blocks = None
    if blocks_by_rank and all(b is not None for b in blocks_by_rank.values()):
        num_blocks = sum(b for b in blocks_by_rank.values() if b is not None)
    block_size = None
    for lb in cache_cfg.values():
        block_size = _int_or_none(lb.get("block_size"))
        break

    rank_series = running if running is not None else waiting
    ranks = len({_rank_of(dict(sk)) for sk in rank_series}) if rank_series else 0
    return ParsedMetrics(
        running=total(running), waiting=total(waiting), kv_usage=kv_usage,
        hit_rate=mean(pick(HIT_RATE)), counters=counters, lora=lora,
        num_gpu_blocks=num_blocks, block_size=block_size, ranks=ranks,
        samples=samples, errors=errors,
        total={q: sum(s.values()) for q, s in counters.items()},
    )
