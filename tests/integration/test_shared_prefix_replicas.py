"""The shared-prefix runner's scale-out cells (`NAME@N`): N real routers behind a real
haproxy, each affinity option's own machinery working (the Redis index merged records
from the other replicas, kvcache-aware had exact events). Not a performance check: the
figures are docs/scale-out.md's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.shared_prefix import policies

ROOT = Path(__file__).resolve().parents[2]


def test_name_at_n_is_that_policy_with_n_replicas() -> None:
    p = policies.get("redis-index@3")
    assert (p.name, p.replicas, p.shared_index, p.kind) == ("redis-index@3", 3, True, "router")
    assert policies.get("best").replicas == 1
    for bad in ("best@0", "best@x", "greedy-reference@3"):
        with pytest.raises(ValueError):
            policies.get(bad)


def test_name_colon_wn_is_that_policy_with_n_workers() -> None:
    p = policies.get("best:w2")
    assert (p.name, p.replicas, p.router_args[-1]) == ("best:w2", 1, "--workers=2")
    assert p.scheduler_yaml == policies.get("best").scheduler_yaml
    q = policies.get("redis-index@3:w2")
    assert (q.replicas, q.shared_index, q.router_args[-1]) == (3, True, "--workers=2")
    for bad in ("best:w0", "best:wx", "best:w", "greedy-reference:w2"):
        with pytest.raises(ValueError):
            policies.get(bad)


def test_three_replica_cells_run_through_haproxy(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "loadtest.shared_prefix.runner", "--out", str(tmp_path), "--quiet",
           "--profile", "tiny", "--seeds", "1", "--max-lag", "1",  # correctness here, not figures
           "--policies", "redis-index@3,kvcache-aware+least-request@3"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())["tables"][0]["rows"]
    for name in ("redis-index@3", "kvcache-aware+least-request@3"):
        [cell] = rows[name]["cells"]
        assert cell["ok"] == cell["requests"], cell["errors"]
        assert cell["replicas"] == 3
        # haproxy spread the connections over every replica
        assert all(n and n >= cell["requests"] / 6 for n in cell["requests_per_replica"]), cell
    shared = rows["redis-index@3"]["cells"][0]["shared_index"]
    # every dispatch published, and merged by the two other replicas
    assert shared["published"] > 0 and shared["merged"] >= shared["published"], shared
    assert shared["redis_errors"] == 0 and shared["dropped"] == 0, shared
    assert rows["kvcache-aware+least-request@3"]["cells"][0]["kvcache_aware_fallbacks"] == 0
