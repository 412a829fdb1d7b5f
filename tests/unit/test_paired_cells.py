"""loadtest/paired_cells.py: the rotation over targets and the paired comparison."""

from __future__ import annotations

from loadtest.loadgen import Sample
from loadtest.paired_cells import compare, rotation, split


def test_rotation_interleaves_every_target_and_cycles_the_direct_engines() -> None:
    urls, owners = rotation({"direct": ["e0", "e1"], "ours": ["r"], "peer": ["p"]})
    assert urls == ["e0", "r", "p", "e1", "r", "p"]
    assert owners == ["direct", "ours", "peer", "direct", "ours", "peer"]
    # consecutive requests never go to the same target twice in a row
    assert all(owners[k] != owners[(k + 1) % len(owners)] for k in range(len(owners)))


def test_split_files_each_sample_under_the_target_of_its_url() -> None:
    _, owners = rotation({"direct": ["e0", "e1"], "ours": ["r"]})
    samples = [Sample(True, 0.001 * k, 0.0, 1, 200, target=k % 4) for k in range(8)]
    by = split(samples, owners)
    assert [round(s.latency_s * 1000) for s in by["direct"]] == [0, 2, 4, 6]
    assert [round(s.latency_s * 1000) for s in by["ours"]] == [1, 3, 5, 7]


def _cell(rep: int, target: str, p50: float, p99: float) -> dict:
    return {"repeat": rep, "target": target, "mode": "stream", "concurrency": 1,
            "latency_ms": {"p50": p50, "p99": p99, "p999": p99 + 1}}


def test_compare_subtracts_direct_of_the_same_window_and_takes_the_median() -> None:
    cells = [_cell(0, "direct", 1.0, 5.0), _cell(0, "ours", 1.5, 9.0),
             _cell(1, "direct", 2.0, 50.0), _cell(1, "ours", 2.4, 52.0),
             _cell(2, "direct", 1.0, 6.0), _cell(2, "ours", 1.2, 9.0)]
    row = compare(cells)["ours"]["stream"]["1"]
    assert row["added_p99_ms_runs"] == [4.0, 2.0, 3.0]
    assert row["added_p99_ms"] == 3.0
    assert [round(x, 3) for x in row["added_p50_ms_runs"]] == [0.5, 0.4, 0.2]
    assert "direct" not in compare(cells)
