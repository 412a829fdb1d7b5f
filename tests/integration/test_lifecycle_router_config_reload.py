"""--router-config reloads like the route config: a file change or POST /admin/reload
installs a new scheduler in every worker; an invalid file keeps the old one and is
reported (worker status, metric, admin answer)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

import harness

LEAST_REQUEST = """\
scheduler:
  plugins:
    Filter: {enabled: [least-request]}
    Score:
      enabled:
      - {name: least-request, weight: 1}
"""
WITH_PREFIX = LEAST_REQUEST + "      - {name: prefix-cache, weight: 2}\n"
UNKNOWN_PLUGIN = LEAST_REQUEST + "      - {name: prefix-cach, weight: 2}\n"
PREFIX_MATCHES = "kthena_router_scheduler_plugin_duration_seconds_count"
RELOADS = "kthena_router_config_reloads_total"


def _write(path: Path, text: str) -> str:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # rename-replace, as editors and ConfigMap updates do
    return hashlib.sha256(text.encode()).hexdigest()


def _prefix_matches(router: harness.Router) -> float:
    fams = harness.parse_metrics(router.metrics_text())
    return harness.metric_value(fams, PREFIX_MATCHES, plugin="prefix-cache", type="match")


def _worker_failures(router: harness.Router) -> float:
    fams = harness.parse_metrics(router.metrics_text())
    return sum(s.value for fam in fams.values() for s in fam.samples
               if s.name == RELOADS and s.labels.get("result") == "failure" and "trigger" not in s.labels)


def _workers(router: harness.Router) -> list[dict]:
    return router.admin_get("/debug/workers").json()["workers"]


def _chat(http: httpx.Client, router: harness.Router, n: int) -> None:
    for i in range(n):  # fresh connections spread the requests over the workers
        r = http.post(f"{router.openai_url}/chat/completions", headers={"connection": "close"},
                      json={"model": "demo", "messages": [{"role": "user", "content": f"question {i} " * 20}],
                            "max_tokens": 2})
        assert r.status_code == 200, r.text[:300]


def test_router_config_change_installs_new_scheduler_and_bad_file_keeps_it(
        simulator: harness.Simulator, tmp_path: Path, router_workers: int) -> None:
    config = harness.write_config(tmp_path / "cfg" / "router.yaml", harness.engine_config(simulator.ports))
    rc_path = tmp_path / "rc" / "router-config.yaml"
    rc_path.parent.mkdir()
    _write(rc_path, LEAST_REQUEST)
    router = harness.start_router(config, tmp_path, workers=router_workers,
                                  extra_args=["--router-config", str(rc_path)])
    http = httpx.Client(timeout=30)
    try:
        pids = router.worker_pids()
        _chat(http, router, 4)
        assert _prefix_matches(router) == 0  # no prefix plugin: no prefix lookup

        # A file change: every worker installs the new pipeline in place.
        digest = _write(rc_path, WITH_PREFIX)
        harness.wait_until(lambda: all(w["router_digest"] == digest for w in _workers(router))
                           and len(_workers(router)) == router.workers, 60, interval=0.1,
                           what="every worker on the new router configuration")
        _chat(http, router, 6)
        assert _prefix_matches(router) == 6  # one prefix lookup per request now
        assert router.worker_pids() == pids  # reloaded, not restarted

        # An invalid file: the old pipeline stays, the error names file and field everywhere.
        failures = _worker_failures(router)
        _write(rc_path, UNKNOWN_PLUGIN)
        field = "scheduler.plugins.Score.enabled[1].name"
        harness.wait_until(lambda: all(field in (w["last_error"] or "") and str(rc_path) in w["last_error"]
                                       for w in _workers(router)), 60, interval=0.1,
                           what="every worker reporting the bad router configuration")
        assert all(w["router_digest"] == digest for w in _workers(router))
        assert _worker_failures(router) >= failures + router.workers
        _chat(http, router, 3)
        assert _prefix_matches(router) == 9  # still the prefix pipeline

        r = router.reload()
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["file"], err["field"]) == (str(rc_path), field) and "prefix-cach" in err["message"]

        # Back to the plain pipeline through POST /admin/reload: applied by every worker.
        digest = _write(rc_path, LEAST_REQUEST)
        r = router.reload()
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["applied"] is True and body["router_config_digest"] == digest
        assert all(w["router_digest"] == digest for w in _workers(router))
        _chat(http, router, 3)
        assert _prefix_matches(router) == 9  # no prefix lookup any more
        assert router.readyz().status_code == 200
    finally:
        http.close()
        router.stop()
