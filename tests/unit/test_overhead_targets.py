"""loadtest/overhead_targets.py: the issue 8 / 14 checks, repeat by repeat."""

from __future__ import annotations

from loadtest.overhead_targets import SGLANG, VLLM, targets


def cell(run: int, target: str, mode: str, conc: int, p50: float, p99: float, cpu: float | None = None,
         rps: float = 100.0) -> dict:
    return {"repeat": run, "target": target, "mode": mode, "concurrency": conc, "rps": rps,
            "latency_ms": {"p50": p50, "p99": p99},
            "cpu_ms_per_req": {} if cpu is None else {target: cpu}}


def run_cells(run: int, ours_p99_hi: float, ours_cpu: float, ours_rps: float) -> list[dict]:
    out = []
    for mode in ("stream", "plain"):
        for conc in (1, 16):
            out.append(cell(run, "direct", mode, conc, 1.0, 10.0))
            out.append(cell(run, SGLANG, mode, conc, 1.5, 20.0, cpu=0.7, rps=1000))  # adds 0.5 / 10
            out.append(cell(run, VLLM, mode, conc, 1.2, 13.0, cpu=0.6, rps=1100))  # adds 0.2 / 3
            p99 = ours_p99_hi if conc == 16 else 15.0  # c=1 adds 5 = 1.67x vllm's 3
            out.append(cell(run, "ours", mode, conc, 1.4, p99, cpu=ours_cpu, rps=ours_rps))
    return out


def test_each_check_against_its_peer_in_the_same_run() -> None:
    t = targets(run_cells(0, ours_p99_hi=29.0, ours_cpu=0.5, ours_rps=1000), ["ours"], [1, 16])
    checks = t["per_run"][0]["ours"]
    assert checks["issue8_added_p99_hi_stream_le_2x_sglang"] is True  # 19 <= 2 x 10
    assert checks["issue8_added_p99_lo_stream_le_2x_vllm"] is True  # 5 <= 2 x 3
    assert checks["issue14_added_p50_lo_stream_le_sglang"] is True  # 0.4 <= 0.5
    assert checks["issue14_cpu_lo_stream_le_vllm"] is True and checks["issue14_cpu_hi_stream_le_vllm"] is True
    assert checks["issue14_rps_hi_plain_ge_sglang"] is True  # 1000 >= 1000
    worse = targets(run_cells(0, ours_p99_hi=31.0, ours_cpu=0.61, ours_rps=999), ["ours"], [1, 16])
    checks = worse["per_run"][0]["ours"]
    assert checks["issue8_added_p99_hi_stream_le_2x_sglang"] is False  # 21 > 20
    assert checks["issue14_cpu_hi_stream_le_vllm"] is False and checks["issue14_rps_hi_plain_ge_sglang"] is False


def test_all_runs_holds_only_if_every_run_holds_and_missing_peers_stay_undecided() -> None:
    cells = run_cells(0, 29.0, 0.5, 1000) + run_cells(1, 31.0, 0.5, 1000)
    t = targets(cells, ["ours"], [1, 16])
    assert t["per_run"][0]["ours"]["issue8_added_p99_hi_stream_le_2x_sglang"] is True
    assert t["all_runs"]["ours"]["issue8_added_p99_hi_stream_le_2x_sglang"] is False
    assert t["all_runs"]["ours"]["issue14_cpu_lo_stream_le_vllm"] is True
    no_peers = [c for c in cells if c["target"] not in (SGLANG, VLLM)]
    assert set(targets(no_peers, ["ours"], [1, 16])["all_runs"]["ours"].values()) == {None}


def test_a_peer_that_adds_nothing_measurable_is_matched_only_by_adding_nothing() -> None:
    cells = run_cells(0, 29.0, 0.5, 1000)
    for c in cells:
        if c["target"] == VLLM and c["concurrency"] == 1:
            c["latency_ms"]["p99"] = 9.0  # below the direct cell: -1 ms
    assert targets(cells, ["ours"], [1, 16])["per_run"][0]["ours"]["issue8_added_p99_lo_stream_le_2x_vllm"] is False


def test_paired_cells_decide_the_low_concurrency_latency_checks() -> None:
    cells = run_cells(0, 29.0, 0.5, 1000)  # sequential cells: ours adds 5 at c=1, vllm 3 (holds)
    paired = [cell(0, "direct", "stream", 1, 1.0, 10.0), cell(0, VLLM, "stream", 1, 1.2, 11.0),
              cell(0, SGLANG, "stream", 1, 1.1, 12.0), cell(0, "ours", "stream", 1, 1.4, 14.0)]
    checks = targets(cells, ["ours"], [1, 16], paired=paired)["per_run"][0]["ours"]
    assert checks["issue8_added_p99_lo_stream_le_2x_vllm"] is False  # paired: 4 > 2 x 1
    assert checks["issue14_added_p50_lo_stream_le_sglang"] is False  # paired: 0.4 > 0.1
    assert checks["issue8_added_p99_hi_stream_le_2x_sglang"] is True  # c=16 stays sequential
    # without a paired cell for this run, the sequential cells decide
    other_run = [dict(c, repeat=1) for c in paired]
    checks = targets(cells, ["ours"], [1, 16], paired=other_run)["per_run"][0]["ours"]
    assert checks["issue8_added_p99_lo_stream_le_2x_vllm"] is True


def test_the_tail_checks_cover_non_streamed_requests_too() -> None:
    cells = run_cells(0, 29.0, 0.5, 1000)
    for c in cells:
        if c["target"] == "ours" and c["mode"] == "plain" and c["concurrency"] == 16:
            c["latency_ms"]["p99"] = 31.0  # adds 21 > 2 x sglang's 10
    checks = targets(cells, ["ours"], [1, 16])["per_run"][0]["ours"]
    assert checks["issue8_added_p99_hi_stream_le_2x_sglang"] is True
    assert checks["issue8_added_p99_hi_plain_le_2x_sglang"] is False
    assert checks["issue8_added_p99_lo_plain_le_2x_vllm"] is True
