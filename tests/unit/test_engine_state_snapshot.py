"""Snapshots: interval means across counter resets, staleness (unknown, never zero), models,
and the router's own observed load."""

from __future__ import annotations

import pytest

from kthena_router.engine_state import EndpointSnapshot, ObservedLoad, SnapshotTracker, parse_metrics, parse_models
from kthena_router.engine_state.snapshot import counter_delta, histogram_delta


def page(ranks: dict[str, tuple[float, float, float, float]], running: int = 2, waiting: int = 1,
         kv: float = 0.5, queries: tuple[float, ...] = (), hits: tuple[float, ...] = ()) -> str:
    """ranks: rank -> (ttft_sum, ttft_count, itl_sum, itl_count)."""
    lines = []
    for i, (rank, (ts, tc, isum, ic)) in enumerate(ranks.items()):
        lb = f'engine="{rank}",model_name="m"'
        lines += [f"vllm:num_requests_running{{{lb}}} {running if i == 0 else 0}",
                  f"vllm:num_requests_waiting{{{lb}}} {waiting if i == 0 else 0}",
                  f"vllm:kv_cache_usage_perc{{{lb}}} {kv}",
                  f"vllm:time_to_first_token_seconds_sum{{{lb}}} {ts}",
                  f"vllm:time_to_first_token_seconds_count{{{lb}}} {tc}",
                  f"vllm:inter_token_latency_seconds_sum{{{lb}}} {isum}",
                  f"vllm:inter_token_latency_seconds_count{{{lb}}} {ic}"]
        if queries:
            lines += [f"vllm:prefix_cache_queries_total{{{lb}}} {queries[i]}",
                      f"vllm:prefix_cache_hits_total{{{lb}}} {hits[i]}"]
    return "\n".join(lines) + "\n"


def scrape(tr: SnapshotTracker, text: str, now: float) -> EndpointSnapshot:
    return tr.on_success(parse_metrics(text, "vllm"), None, now)


def test_first_scrape_gives_lifetime_means_then_interval_means() -> None:
    tr = SnapshotTracker("e", "vllm")
    s1 = scrape(tr, page({"0": (10.0, 10, 1.0, 100)}), 1.0)
    assert s1.ttft_mean_s == pytest.approx(1.0)
    assert s1.tpot_mean_s == pytest.approx(0.01)
    # 5 more requests with a total of 1 s TTFT -> the interval mean is 0.2 s, not 11/15
    s2 = scrape(tr, page({"0": (11.0, 15, 2.0, 150)}), 2.0)
    assert s2.ttft_mean_s == pytest.approx(0.2)
    assert s2.ttft_samples == 5
    assert s2.tpot_mean_s == pytest.approx(0.02)
    # no request in the interval: the last mean is kept (an idle engine is not "0 s")
    s3 = scrape(tr, page({"0": (11.0, 15, 2.0, 150)}), 3.0)
    assert s3.ttft_mean_s == pytest.approx(0.2)
    assert s3.ttft_samples == 5


def test_restart_of_one_rank_is_not_hidden_by_the_other() -> None:
    tr = SnapshotTracker("e", "vllm")
    scrape(tr, page({"0": (100.0, 100, 1.0, 10), "1": (100.0, 100, 1.0, 10)}), 1.0)
    # rank 1 restarted (count 100 -> 4) while rank 0 grew by 200: the summed count still
    # went up (200 -> 304): a delta of the sums would see no reset and give -52 s / 104
    s = scrape(tr, page({"0": (140.0, 300, 1.0, 10), "1": (8.0, 4, 1.0, 10)}), 2.0)
    # rank 0: +40 s over +200; rank 1 since its restart: 8 s over 4
    assert s.ttft_mean_s == pytest.approx(48.0 / 204)
    assert s.ttft_samples == 204


def test_whole_engine_restart_uses_the_new_values() -> None:
    tr = SnapshotTracker("e", "vllm")
    scrape(tr, page({"0": (50.0, 100, 5.0, 1000)}), 1.0)
    s = scrape(tr, page({"0": (3.0, 2, 0.3, 10)}), 2.0)
    assert s.ttft_mean_s == pytest.approx(1.5)
    assert s.tpot_mean_s == pytest.approx(0.03)
    assert s.ttft_mean_s is not None and s.ttft_mean_s > 0  # never a negative mean


def test_delta_helpers() -> None:
    a, b = (("engine", "0"),), (("engine", "1"),)
    assert counter_delta({a: 10, b: 5}, {a: 15, b: 2}) == 5 + 2
    assert counter_delta(None, {a: 3}) == 3
    assert counter_delta({a: 3}, {a: 3, b: 4}) == 4  # a new series counts from zero
    # the sum went down while the count did not: still a restart
    assert histogram_delta({a: 10.0}, {a: 5.0}, {a: 2.0}, {a: 6.0}) == (2.0, 6.0)


def test_prefix_hit_rate_over_the_interval() -> None:
    tr = SnapshotTracker("e", "vllm")
    s1 = scrape(tr, page({"0": (0, 0, 0, 0), "1": (0, 0, 0, 0)}, queries=(100, 100), hits=(0, 0)), 1.0)
    assert s1.prefix_hit_rate == 0.0
    s2 = scrape(tr, page({"0": (0, 0, 0, 0), "1": (0, 0, 0, 0)}, queries=(200, 300), hits=(90, 210)), 2.0)
    assert s2.prefix_hit_rate == pytest.approx(300 / 300)
    s3 = scrape(tr, page({"0": (0, 0, 0, 0), "1": (0, 0, 0, 0)}, queries=(300, 300), hits=(140, 210)), 3.0)
    assert s3.prefix_hit_rate == pytest.approx(0.5)
    # rank 0 restarts
    s4 = scrape(tr, page({"0": (0, 0, 0, 0), "1": (0, 0, 0, 0)}, queries=(40, 340), hits=(10, 210)), 4.0)
    assert s4.prefix_hit_rate == pytest.approx(10 / 80)


def test_sglang_hit_rate_gauge() -> None:
    tr = SnapshotTracker("e", "sglang")
    s = tr.on_success(parse_metrics('sglang:num_running_reqs{dp_rank="0"} 1\n'
                                    'sglang:num_queue_reqs{dp_rank="0"} 0\n'
                                    'sglang:cache_hit_rate{dp_rank="0"} 0.25\n', "sglang"), None, 1.0)
    assert (s.running, s.waiting, s.prefix_hit_rate, s.kv_usage, s.ttft_mean_s) == (1, 0, 0.25, None, None)


def test_failed_scrape_is_stale_not_zero() -> None:
    tr = SnapshotTracker("e", "vllm")
    ok = scrape(tr, page({"0": (1.0, 1, 1.0, 10)}, running=7, waiting=3, kv=0.9), 1.0)
    assert (ok.running, ok.waiting, ok.queue, ok.kv_usage) == (7, 3, 10, 0.9)
    assert not ok.stale
    bad = tr.on_failure(2.0, "ClientConnectorError: refused")
    assert bad.stale and bad.consecutive_failures == 1
    for value in (bad.running, bad.waiting, bad.queue, bad.kv_usage, bad.ttft_mean_s,
                  bad.tpot_mean_s, bad.prefix_hit_rate, bad.loaded_loras, bad.max_lora):
        assert value is None
    assert (bad.last_running, bad.last_waiting, bad.last_kv_usage) == (7, 3, 0.9)
    assert bad.scraped_at == 1.0 and bad.attempted_at == 2.0
    assert tr.on_failure(3.0, "x").consecutive_failures == 2
    # recovery: fresh again, the gap's requests count in the next interval mean
    again = scrape(tr, page({"0": (4.0, 4, 1.0, 10)}, running=1, waiting=0), 4.0)
    assert not again.stale and again.consecutive_failures == 0
    assert again.running == 1 and again.ttft_mean_s == pytest.approx(1.0)


def test_first_scrape_failure_is_stale_with_nothing_known() -> None:
    s = SnapshotTracker("e", "vllm").on_failure(5.0, "timeout")
    assert s.stale and s.scraped_at is None and s.running is None and s.queue is None


def test_old_snapshot_ages_into_stale() -> None:
    s = scrape(SnapshotTracker("e", "vllm"), page({"0": (1.0, 1, 1.0, 1)}, running=4), 10.0)
    assert s.aged(12.9, interval_s=1.0) is s
    aged = s.aged(13.5, interval_s=1.0)
    assert aged.stale and aged.running is None and aged.last_running == 4
    assert not s.stale  # the original is unchanged (frozen)


def test_parse_models_splits_base_and_adapters() -> None:
    body = {"object": "list", "data": [
        {"id": "llama", "root": "/models/llama", "parent": None},
        {"id": "llama-alias", "root": "/models/llama", "parent": None},
        {"id": "sql", "root": "/loras/sql", "parent": "llama"},
        {"id": "chat", "root": "/loras/chat", "parent": "llama"},
        {"object": "garbage"},
    ]}
    m = parse_models(body)
    assert m.bases == ("llama", "llama-alias")
    assert m.adapters == ("chat", "sql")
    with pytest.raises(ValueError):
        parse_models({"error": "nope"})


def test_loras_from_models_and_lora_info() -> None:
    text = page({"0": (0, 0, 0, 0)}) + (
        'vllm:lora_requests_info{engine="0",max_lora="2",running_lora_adapters="sql",'
        'waiting_lora_adapters="chat"} 1.0\n')
    s = SnapshotTracker("e", "vllm").on_success(
        parse_metrics(text), parse_models({"data": [{"id": "m", "parent": None},
                                                    {"id": "sql", "parent": "m"}]}), 1.0)
    assert s.loaded_loras == ("sql",)
    assert (s.running_loras, s.waiting_loras, s.max_lora) == (("sql",), ("chat",), 2)


def test_observed_load_in_flight_and_ewma() -> None:
    obs = ObservedLoad(alpha=0.5)
    assert obs.in_flight("a") == 0 and obs.ttft_s("a") is None
    obs.start("a")
    obs.start("a")
    assert obs.in_flight("a") == 2
    obs.finish("a", ttft_s=1.0, tpot_s=0.1)
    obs.finish("a", ttft_s=3.0)
    obs.finish("a")  # an extra finish never goes below zero
    assert obs.in_flight("a") == 0
    assert obs.ttft_s("a") == pytest.approx(2.0)
    assert obs.tpot_s("a") == pytest.approx(0.1)
    obs.start("b")
    obs.retain(["a"])
    assert obs.in_flight("b") == 0
    obs.finish("b")  # finishing a purged endpoint's request is harmless
    assert obs.in_flight("b") == 0


def test_queue_estimate_reacts_within_one_request() -> None:
    obs = ObservedLoad()
    tr = SnapshotTracker("e", "vllm")
    obs.start("e")  # in flight before the scrape: the engine counts it already
    snap = tr.on_success(parse_metrics(page({"0": (0, 0, 0, 0)}, running=3, waiting=0)), None, 1.0,
                         observed_mark=obs.mark("e"))
    assert obs.queue_estimate("e", snap) == 3
    obs.start("e")
    obs.start("e")
    assert obs.queue_estimate("e", snap) == 5  # two dispatched since the scrape
    obs.finish("e")
    obs.finish("e")
    obs.finish("e")
    assert obs.queue_estimate("e", snap) == 2  # three finished since
    # unknown stays unknown: a stale snapshot gives None, whatever this worker saw
    stale = tr.on_failure(2.0, "refused")
    assert obs.queue_estimate("e", stale) is None
    assert obs.queue_estimate("e", None) is None
    # never below this worker's own in-flight
    for _ in range(6):
        obs.start("e")
    fresh = tr.on_success(parse_metrics(page({"0": (0, 0, 0, 0)}, running=0, waiting=0)), None, 3.0,
                          observed_mark=obs.mark("e"))
    assert obs.queue_estimate("e", fresh) == 6
