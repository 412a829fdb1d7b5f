"""The PD benchmark's CLI (loadtest/bench_pd.py) at a tiny size.

The aggregated cell runs end to end (simulator + router + streaming client, seconds);
the JSON's shape and the latencies are checked, never wall-clock thresholds. The PD cells
are checked through --dry-run: the CLI accepts them and writes their configuration, and
the router's own loader accepts the routes (pdGroup, kvConnector nixl, labelled
endpoints). Running the PD cells end to end needs the router's PD dispatch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from kthena_router.config.loader import load_config_file

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--seeds", "1", "--rates", "4,8", "--requests-per-rate", "6", "--prompt-len", "512",
        "--output-len", "12", "--time-scale", "2", "--followup-new-max", "128",
        "--followup-min-gap-s", "0.2", "--quiet"]


def run(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadtest.bench_pd", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def test_aggregated_cell_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "pd.json"
    p = run("--cells", "agg", "--out", str(out), *TINY)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert (tmp_path / "pd.md").read_text() in p.stdout
    assert summary["time_scale"] == 2 and summary["seeds"] == [1]
    assert summary["workload"]["prompt_len"] == 512 and summary["workload"]["rates"] == [4.0, 8.0]
    [cell] = summary["cells"]
    assert cell["name"] == "agg" and cell["roles"] == ["both", "both"] and "error" not in cell
    [seed] = cell["per_seed"]
    assert [ph["rate"] for ph in seed["phases"]] == [4.0, 8.0]
    for ph in seed["phases"] + cell["pooled"]:
        assert ph["sent"] == ph["ok"] == 6 and ph["failed"] == 0
        for dist in (ph["ttft_ms"], ph["itl_ms"]):
            assert 0 < dist["p50"] <= dist["p90"] <= dist["p99"]
        assert ph["achieved_req_s"] > 0
    for ph in seed["phases"]:
        assert ph["tokens_per_reply"] == [12]  # every content chunk was seen
        assert ph["itl_ms"]["n"] == 6 * 11
        # a 512-token prefill costs more than one decode step (calibration: ~13.6 vs ~5.7 ms)
        assert ph["ttft_ms"]["p50"] > ph["itl_ms"]["p50"]
        assert ph["e2e_ms"]["p50"] > ph["ttft_ms"]["p50"]
        assert ph["prefix_queries"] >= 6 * 512 and "pd" not in ph
    m = cell["max_rate"]
    assert set(m) == {"itl", "itl_ttft", "itl_per_seed", "itl_ttft_per_seed"}
    assert m["itl"] in (None, 4.0, 8.0) and len(m["itl_per_seed"]) == 1
    assert "Highest rate with p99 ITL <= 50 ms" in p.stdout


def test_pd_cells_accepted_by_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "pd.json"
    p = run("--cells", "agg,agg-c1024,pd,pd-cond", "--min-uncached", "256,1024", "--seeds", "tuning",
            "--out", str(out), "--dry-run")
    assert p.returncode == 0, p.stderr
    cfg = tmp_path / "pd-configs"
    assert "--roles both,both --kv-bandwidth-gbps 400.0 --block-size 16 --max-num-seqs 256 " \
           "--max-num-batched-tokens 1024" in p.stdout
    for name, roles, mu in (("agg", "both,both", None), ("agg-c1024", "both,both", None),
                            ("pd", "prefill,decode", 0),
                            ("pd-cond-256", "prefill,decode", 256), ("pd-cond-1024", "prefill,decode", 1024)):
        assert f"# {name}\n" in p.stdout and f"--roles {roles}" in p.stdout
        servers = list(load_config_file(cfg / name / "routes.yaml").servers.values())
        assert len(servers) == 1
        rc = yaml.safe_load((cfg / name / "router-config.yaml").read_text())
        assert rc["scheduler"]["plugins"]["Score"]["enabled"]
        if mu is None:
            assert servers[0].pd_group is None and "pd" not in rc
        else:
            assert servers[0].pd_group is not None and servers[0].pd_connector == "nixl"
            assert rc["pd"] == {"prefillTimeout": "60s", "minUncachedTokens": mu}
    assert not out.exists()  # nothing ran


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    for bad in (["--cells", "pd-cond-0"], ["--cells", "agg,agg"], ["--cells", "disagg"], ["--cells", "agg-c8"],
                ["--rates", "2,x"], ["--min-uncached", "1.5"], ["--seeds", "nope"]):
        p = run("--out", str(tmp_path / "x.json"), "--dry-run", *bad)
        assert p.returncode == 2 and "error:" in p.stderr, (bad, p.stderr)
