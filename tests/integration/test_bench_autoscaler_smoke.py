"""The autoscaler benchmark (loadtest/bench_autoscaler.py) on a tiny compressed day.

Real processes end to end: three simulated engines on 127.0.0.11-13, the router in file
mode, the real autoscaling algorithm and collector, the open-loop client. A trace day of
24 simulated seconds whose burst overloads one engine (max-num-seqs 1) must make the
autoscaler add replicas; the outputs' structure is checked. No wall-clock assertions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtest.autoscale_trace import BURST

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_day_scales_up_under_the_burst(tmp_path: Path) -> None:
    out = tmp_path / "as"
    args = ["--seeds", "1", "--configs", "stable", "--day-s", "24", "--peak-rate", "8", "--target-waiting", "1",
            "--max-replicas", "3", "--max-num-seqs", "1", "--time-scale", "1", "--period-s", "60",
            "--out", str(out)]
    p = subprocess.run([sys.executable, "-m", "loadtest.bench_autoscaler", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["trace"]["compression"] == 86400 / 24
    [cell] = doc["cells"]
    assert cell["config"] == "stable" and cell["seed"] == 1
    assert cell["policy"]["metrics"] == [{"name": "num_requests_waiting", "targetValue": "1.0"}]
    assert cell["requests"] > 50 and cell["ok"] == cell["requests"] and cell["errors"] == 0
    assert 0 <= cell["slo_misses"] <= cell["requests"]
    assert 0 < cell["ttft_p50_s"] <= cell["ttft_p99_s"]
    assert set(cell["hour_p99_s"]) <= {str(h) for h in range(24)}
    assert 0 <= cell["hours_p99_over_slo"] <= len(cell["hour_p99_s"])
    # replica-seconds: at least the one replica for the whole day, at most all three
    assert 24 <= cell["replica_seconds_sim"] <= 3 * 24 + 1e-6
    assert abs(cell["replica_hours_trace"] - cell["replica_seconds_sim"] * (86400 / 24) / 3600) < 1e-6
    tl = cell["timeline"]
    assert tl and all(1 <= r["replicas"] <= 3 and r["active"] <= r["replicas"] for r in tl)
    assert all(r["mode"] == "Stable" for r in tl)  # panic mode is off in this configuration
    during = [r["replicas"] for r in tl if BURST[0] <= r["hour"] < BURST[1] + 0.5]
    assert during and max(during) >= 2, "no scale-up under the burst"
    assert cell["reloads"] >= 1  # the added replica reached the router's config
    md = (out / "results.md").read_text()
    assert "| 1 | stable |" in md and md in p.stdout
