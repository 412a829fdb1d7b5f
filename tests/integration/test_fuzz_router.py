"""A short run of the fuzz driver (loadtest/fuzz_router.py) against a real router (2 workers,
prefix-cache scheduling or round-robin, decided by the Rust front or by Python; a 64 KiB body
limit) in front of the real simulator: generated valid
and malformed requests on every proxied path, odd methods and headers, chunked, oversized and
truncated bodies, raw-socket garbage, streaming and not, client aborts. It fails on any
router-made 5xx, non-OpenAI error body, missing reply, broken stream, leak, hang, restarted
worker or unusable router afterwards. The 100,000-request run: docs (closing note of step 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import harness
import pytest

from loadtest.fuzz_cases import MAX_BODY_BYTES

REQUESTS = 3000
FAMILIES = {"valid", "stream", "wrong_field", "garbage_json", "unknown_model", "odd_prompt", "method", "headers",
            "chunked", "large", "oversized", "truncated", "bad_chunked", "wire", "abort"}


@pytest.fixture(params=["prefix-cache", "round-robin", "python"])
def fuzz_router(request: pytest.FixtureRequest, simulator: harness.Simulator,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Router, str]]:
    """prefix-cache.yaml or no router configuration (round-robin), the Rust front deciding
    plain routes itself (front/table.py); or prefix-cache with Python deciding every
    completion (`--front-table off`)."""
    work = tmp_path_factory.mktemp("fuzz")
    cfg = harness.write_config(work / "router.yaml", harness.engine_config(simulator.ports, lora=("demo-lora-a",
                                                                                                   "demo-lora-b")))
    sched = harness.REPO / "configs" / "scheduling" / "prefix-cache.yaml"
    extra = [] if request.param == "round-robin" else ["--router-config", str(sched)]
    if request.param == "python":
        extra += ["--front-table", "off"]
    with harness.start_router(cfg, work, workers=2, extra_args=["--max-body-bytes", str(MAX_BODY_BYTES),
                                                                *extra]) as r:
        yield r, request.param


def test_short_fuzz_run_finds_no_violation(fuzz_router: tuple[harness.Router, str], simulator: harness.Simulator,
                                           tmp_path) -> None:
    fuzz_router, scheduling = fuzz_router
    report = tmp_path / "fuzz.json"
    argv = [sys.executable, "-m", "loadtest.fuzz_router", "--requests", str(REQUESTS), "--seed", "7",
            "--router", f"{harness.HOST}:{fuzz_router.port}", "--router-admin", fuzz_router.admin_url,
            "--sim-admin", simulator.admin_url, "--engine-ports", ",".join(map(str, simulator.ports)),
            "--report", str(report)]
    proc = subprocess.run(argv, cwd=harness.REPO, capture_output=True, text=True, timeout=240)
    assert report.exists(), proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["sent"] == REQUESTS
    assert data["failures"] == {}, json.dumps(data["examples"], indent=1)[:6000]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(data["by_kind_status"]) >= FAMILIES, sorted(data["by_kind_status"])
    assert data["by_kind_status"]["valid"].get("200", 0) > 0 and data["by_kind_status"]["stream"].get("200", 0) > 0
    assert harness.engine_total(simulator) > 0
    table = harness.metric_value(harness.parse_metrics(fuzz_router.metrics_text()),
                                 "kthena_router_front_table_decisions_total")
    assert (table > 0) == (scheduling != "python"), table  # which side decided the valid ones
