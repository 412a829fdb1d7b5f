"""Reading metrics from a pod's /metrics page (Prometheus text format).

Parsing is prometheus_client.parser's. A page is first cut down to the lines of the wanted
names (their samples and their # TYPE / # HELP lines): an engine page is ~700 lines of
which a policy reads one or two, and the library parses every line in pure Python.

A metric's value on one page is the sum over its series (Kthena sums a counter's or a
gauge's labelled samples; vLLM exports one series per DP rank and per served model name).
A counter may be named with or without `_total`. Histograms are not read (Kthena takes a
p95 over a 60 s window of bucket deltas; not implemented here: such a metric reads as
missing and is logged).

Engine defaults (ours; Kthena needs a metricSources entry per metric): when a metric has no
explicit `pod.name`, its key is tried first, then the vLLM and SGLang names of the same
quantity as the router reads them (kthena_router.engine_state.metrics_parse), e.g.
`num_requests_waiting` -> `vllm:num_requests_waiting`, `sglang:num_queue_reqs`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kthena_router.engine_state import metrics_parse as engine

__all__ = ["ALIASES", "ScrapeFailed", "candidates", "fetch_page", "read_metrics"]

log = logging.getLogger(__name__)

MAX_PAGE_BYTES = 16 * 1024 * 1024
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"  # the text format, not OpenMetrics/protobuf


class ScrapeFailed(Exception):
    pass


def _engine_names(quantity: str) -> tuple[str, ...]:
    """The router's vLLM and SGLang sample names of one quantity, current names first."""
    tables = (engine._VLLM, engine._SGLANG)  # the router's own tables: one source of truth
    found = sorted((pref, name) for t in tables for name, (q, pref) in t.items() if q == quantity)
    return tuple(name for _, name in found)


# metric key (as written in a policy) -> engine sample names
ALIASES: dict[str, tuple[str, ...]] = {}
for _keys, _q in ((("num_requests_waiting", "num_queue_reqs", engine.WAITING), engine.WAITING),
                  (("num_requests_running", "num_running_reqs", engine.RUNNING), engine.RUNNING),
                  (("kv_cache_usage", "kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage",
                    engine.KV_USAGE), engine.KV_USAGE)):
    for _k in _keys:
        ALIASES[_k] = _engine_names(_q)


def candidates(key: str, explicit_name: str | None) -> tuple[str, ...]:
    """The sample names that can carry metric `key`, in order of preference."""
    if explicit_name:
        return (explicit_name,)
    return (key, *(a for a in ALIASES.get(key, ()) if a != key))


def _prefilter(text: str, names: Iterable[str]) -> str:
    """Only the lines of those metric names (and their _total / _sum / ... variants)."""
    alt = "|".join(re.escape(nm) for nm in sorted(set(names), key=len, reverse=True))
    if not alt:
        return ""
    pattern = re.compile(rf"^(?:# (?:TYPE|HELP) )?(?:{alt})(?:_total|_created)?(?:[{{ \t]|$).*$", re.M)
    return "\n".join(m.group() for m in pattern.finditer(text)) + "\n"


def read_metrics(text: str, wanted: Mapping[str, tuple[str, ...]]) -> dict[str, float]:
    """{metric key: value} for the keys found on the page (`wanted`: key -> candidate sample
    names, the first present one wins). Raises ValueError on a page the parser refuses."""
    names = {nm for cands in wanted.values() for nm in cands}
    sums: dict[str, float] = {}
    histograms: set[str] = set()
    for fam in text_string_to_metric_families(_prefilter(text, names)):
        if fam.type in ("histogram", "gaugehistogram", "summary"):
            histograms.add(fam.name)
            continue
        for s in fam.samples:
            name = s.name
            if fam.type == "counter" and name == fam.name + "_total" and name not in names:
                name = fam.name  # a counter asked for without its _total suffix
            if name in names and not name.endswith("_created"):
                sums[name] = sums.get(name, 0.0) + float(s.value)
    out: dict[str, float] = {}
    for key, cands in wanted.items():
        for nm in cands:
            if nm in sums and math.isfinite(sums[nm]):
                out[key] = sums[nm]
                break
            if nm in histograms:
                log.warning("metric %s is a histogram/summary: not supported by the autoscaler (missing)", nm)
                break
    return out


async def fetch_page(session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> str:
    """GET one metrics page; ScrapeFailed on any error or non-2xx status."""
    try:
        async with session.get(url, timeout=timeout, headers={"Accept": ACCEPT}) as resp:
            if not 200 <= resp.status <= 299:
                raise ScrapeFailed(f"{url}: HTTP {resp.status}")
            body = await resp.content.read(MAX_PAGE_BYTES + 1)
            if len(body) > MAX_PAGE_BYTES:
                raise ScrapeFailed(f"{url}: page larger than {MAX_PAGE_BYTES} bytes")
            return body.decode("utf-8", errors="replace")
    except ScrapeFailed:
        raise
    except (aiohttp.ClientError, TimeoutError, UnicodeError, ValueError) as exc:
        raise ScrapeFailed(f"{url}: {type(exc).__name__}: {exc}") from None
