"""Per-endpoint engine state: an immutable snapshot per scrape, built by a small tracker.

Unknown is not zero. Every load accessor (`running`, `waiting`, `kv_usage`, ...) returns
None when the data is stale (the last scrape failed, or the last good one is older than
`stale_after` intervals) or when the engine does not export the family. The last good
values stay readable as `last_*` fields, for metrics and debugging, never for scoring.

How a scorer should treat None:
- load signals (running, waiting, kv_usage): worst case. Score the endpoint as the most
  loaded of the candidates (score 0), so a silent engine is never taken for an idle one;
  it stays a candidate (failover still works) and the router's own in-flight count
  (ObservedLoad) still orders such endpoints among themselves.
- latency (ttft_mean_s, tpot_mean_s) on a fresh snapshot is None until the engine has
  served a request: neutral (the mean of the known candidates), so new engines get
  traffic. On a stale snapshot: worst case, as for load.
- prefix hit rate and LoRA lists: neutral / "unknown" (do not filter on them).

Interval means. TTFT and TPOT means, and the prefix hit rate, are deltas between two
successful scrapes: delta(_sum) / delta(_count), taken per series (per DP rank) and then
summed. A series whose value went down restarted: as Prometheus' rate() does, its new value
is its delta (what it counted since the restart). A series seen for the first time also
counts from zero, so the first scrape yields the lifetime mean. When no request finished
in an interval the previous mean is kept (an idle engine keeps its last known latency).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .metrics_parse import (
    PREFIX_HITS,
    PREFIX_QUERIES,
    TPOT_COUNT,
    TPOT_SUM,
    TTFT_COUNT,
    TTFT_SUM,
    ParsedMetrics,
    SeriesKey,
)

STALE_AFTER_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    key: str
    flavour: str
    scraped_at: float | None  # event-loop (monotonic) time of the last good scrape
    attempted_at: float  # event-loop time of the last attempt
    stale: bool
    consecutive_failures: int
    last_error: str | None
    # last good values; None = never scraped or family not exported. Use the accessors.
    last_running: int | None = None
    last_waiting: int | None = None
    last_kv_usage: float | None = None
    last_prefix_hit_rate: float | None = None  # 0..1, last interval with queries
    last_ttft_mean_s: float | None = None
    last_tpot_mean_s: float | None = None
    ttft_samples: int = 0  # requests behind last_ttft_mean_s (in its interval)
    tpot_samples: int = 0
    last_loaded_loras: tuple[str, ...] | None = None  # from /v1/models (None: unknown)
    last_running_loras: tuple[str, ...] | None = None  # from lora_requests_info
    last_waiting_loras: tuple[str, ...] | None = None
    last_max_lora: int | None = None
    num_gpu_blocks: int | None = None  # KV capacity in blocks, summed over DP ranks
    block_size: int | None = None
    dp_ranks: int = 0
    # ObservedLoad.mark() taken when this scrape was sent: lets ObservedLoad add the
    # requests the router dispatched (and saw finish) since the engine counted its queue
    observed_mark: tuple[int, int] | None = None

    # --- accessors for scoring: None means unknown (see module docstring) ---------------
    def _fresh(self, value: Any) -> Any:
        return None if self.stale else value

    @property
    def running(self) -> int | None:
        return self._fresh(self.last_running)

    @property
    def waiting(self) -> int | None:
        return self._fresh(self.last_waiting)

    @property
    def queue(self) -> int | None:
        """running + waiting, or None if either is unknown."""
        if self.stale or self.last_running is None or self.last_waiting is None:
            return None
        return self.last_running + self.last_waiting

    @property
    def kv_usage(self) -> float | None:
        return self._fresh(self.last_kv_usage)

    @property
    def prefix_hit_rate(self) -> float | None:
        return self._fresh(self.last_prefix_hit_rate)

    @property
    def ttft_mean_s(self) -> float | None:
        return self._fresh(self.last_ttft_mean_s)

    @property
    def tpot_mean_s(self) -> float | None:
        return self._fresh(self.last_tpot_mean_s)

    @property
    def loaded_loras(self) -> tuple[str, ...] | None:
        return self._fresh(self.last_loaded_loras)

    @property
    def running_loras(self) -> tuple[str, ...] | None:
        return self._fresh(self.last_running_loras)

    @property
    def waiting_loras(self) -> tuple[str, ...] | None:
        return self._fresh(self.last_waiting_loras)

    @property
    def max_lora(self) -> int | None:
        return self._fresh(self.last_max_lora)

    def aged(self, now: float, interval_s: float,
             stale_after: int = STALE_AFTER_INTERVALS) -> EndpointSnapshot:
        """This snapshot, marked stale if its last good scrape is too old at `now`."""
        if self.stale:
            return self
        if self.scraped_at is None or now - self.scraped_at > stale_after * interval_s:
            return replace(self, stale=True)
        return self


@dataclass(frozen=True, slots=True)
class ModelsInfo:
    """What /v1/models says: served base names and loaded adapters."""

    bases: tuple[str, ...]
    adapters: tuple[str, ...]


def parse_models(body: Any) -> ModelsInfo:
    """OpenAI /v1/models JSON -> ModelsInfo. An adapter is an entry with a `parent` (vLLM
    sets it to the base model for LoRA adapters, null for the base and its aliases)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models: no 'data' list")
    bases: list[str] = []
    adapters: list[str] = []
    for card in data:
        if not isinstance(card, dict) or not isinstance(card.get("id"), str):
            continue
        parent = card.get("parent")
        if isinstance(parent, str) and parent and parent != card["id"]:
            adapters.append(card["id"])
        else:
            bases.append(card["id"])
    return ModelsInfo(tuple(sorted(set(bases))), tuple(sorted(set(adapters))))


def counter_delta(prev: dict[SeriesKey, float] | None,
                  cur: dict[SeriesKey, float]) -> float:
    """Sum over series of the increase since `prev`; a decrease (restart) or a new series
    counts its whole current value (Prometheus rate() semantics)."""
    total = 0.0
    for sk, v in cur.items():
        p = None if prev is None else prev.get(sk)
        total += v if p is None or v < p else v - p
    return total


def histogram_delta(prev_sum: dict[SeriesKey, float] | None,
                    prev_count: dict[SeriesKey, float] | None,
                    cur_sum: dict[SeriesKey, float],
                    cur_count: dict[SeriesKey, float]) -> tuple[float, float]:
    """(delta sum, delta count) over series; a series restarts when its count or its sum
    went down, and then contributes its current sum and count."""
    dsum = dcount = 0.0
    for sk, c in cur_count.items():
        s = cur_sum.get(sk, 0.0)
        pc = None if prev_count is None else prev_count.get(sk)
        ps = None if prev_sum is None else prev_sum.get(sk)
        if pc is None or ps is None or c < pc or s < ps:
            dsum += s
            dcount += c
        else:
            dsum += s - ps
            dcount += c - pc
    return dsum, dcount


class SnapshotTracker:
    """Mutable per-endpoint state between scrapes (previous counters, last means);
    produces an immutable EndpointSnapshot per scrape. One per endpoint, one task."""

    __slots__ = ("key", "flavour", "_counters", "_snap")

    def __init__(self, key: str, flavour: str) -> None:
        self.key = key
        self.flavour = flavour
        self._counters: dict[str, dict[SeriesKey, float]] = {}
        self._snap: EndpointSnapshot | None = None

    @property
    def snapshot(self) -> EndpointSnapshot | None:
        return self._snap

    def adopt(self, snap: EndpointSnapshot) -> None:
        """A snapshot scraped by another process (the pod-state hub) becomes the current one."""
        self._snap = snap

    def on_success(self, parsed: ParsedMetrics, models: ModelsInfo | None, now: float,
                   observed_mark: tuple[int, int] | None = None) -> EndpointSnapshot:
        prev = self._snap
        prev_c = self._counters
        cur_c = parsed.counters

        def mean(sum_q: str, count_q: str, last: float | None,
                 last_n: int) -> tuple[float | None, int]:
            if count_q not in cur_c:
                return None, 0  # family not exported (any more)
            dsum, dcount = histogram_delta(prev_c.get(sum_q), prev_c.get(count_q),
                                           cur_c[sum_q], cur_c[count_q])
            if dcount > 0:
                return dsum / dcount, int(dcount)
            return last, last_n

        ttft, ttft_n = mean(TTFT_SUM, TTFT_COUNT, prev.last_ttft_mean_s if prev else None,
                            prev.ttft_samples if prev else 0)
        tpot, tpot_n = mean(TPOT_SUM, TPOT_COUNT, prev.last_tpot_mean_s if prev else None,
                            prev.tpot_samples if prev else 0)

        hit_rate: float | None
        if PREFIX_QUERIES in cur_c and PREFIX_HITS in cur_c:
            dq = counter_delta(prev_c.get(PREFIX_QUERIES), cur_c[PREFIX_QUERIES])
            dh = counter_delta(prev_c.get(PREFIX_HITS), cur_c[PREFIX_HITS])
            if dq > 0:
                hit_rate = min(1.0, max(0.0, dh / dq))
            else:
                hit_rate = prev.last_prefix_hit_rate if prev else None
        else:
            hit_rate = parsed.hit_rate  # SGLang exports the rate itself

        lora = parsed.lora
        snap = EndpointSnapshot(
            key=self.key, flavour=self.flavour, scraped_at=now, attempted_at=now,
            stale=False, consecutive_failures=0, last_error=None,
            last_running=_int(parsed.running), last_waiting=_int(parsed.waiting),
            last_kv_usage=parsed.kv_usage, last_prefix_hit_rate=hit_rate,
            last_ttft_mean_s=ttft, last_tpot_mean_s=tpot,
            ttft_samples=ttft_n, tpot_samples=tpot_n,
            last_loaded_loras=models.adapters if models is not None else None,
            last_running_loras=lora.running if lora else None,
            last_waiting_loras=lora.waiting if lora else None,
            last_max_lora=lora.max_lora if lora else None,
            num_gpu_blocks=parsed.num_gpu_blocks, block_size=parsed.block_size,
            dp_ranks=parsed.ranks, observed_mark=observed_mark,
        )
        self._counters = cur_c
        self._snap = snap
        return snap

    def on_failure(self, now: float, error: str) -> EndpointSnapshot:
        """Keep the last good values (readable only as last_*) and the counter baseline,
        so the next good scrape's means cover the whole gap."""
        prev = self._snap
        if prev is None:
            snap = EndpointSnapshot(key=self.key, flavour=self.flavour, scraped_at=None,
                                    attempted_at=now, stale=True, consecutive_failures=1,
                                    last_error=error)
        else:
            snap = replace(prev, attempted_at=now, stale=True,
                           consecutive_failures=prev.consecutive_failures + 1,
                           last_error=error)
        self._snap = snap
        return snap


def _int(v: float | None) -> int | None:
    return None if v is None else int(round(v))
