"""A PD ModelServer's topology is visible to operators in a running router: /debug/pd
(admin, per worker), the kthena_router_pd_* gauges and a WARNING log once per change,
with and without --router-config (its `pd` section's settings appear in /debug/pd).
The two-hop dispatch itself is tested with the dispatcher (not here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness

PD_GROUP = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}


def _docs(ports: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    server = harness.server_doc("pd", "demo", {"app": "pd"})
    server["spec"]["workloadSelector"]["pdGroup"] = PD_GROUP
    eps = harness.endpoints_doc("pd-engines", [], {})
    eps["spec"]["endpoints"] = [{"address": harness.HOST, "port": p, "labels": {"app": "pd", **labels}}
                                for p, labels in ports.items()]
    return [harness.route_doc("pd", "demo", "pd"), server, eps]


def _pd_views(router: harness.Router) -> list[dict[str, Any]]:
    r = router.admin_get("/debug/pd")
    assert r.status_code == 200, r.text
    return [w["servers"][0] for w in r.json()["workers"]]


def _gauge(router: harness.Router, name: str, **labels: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), name, **labels)


def _run(tmp_path: Path, workers: int, extra: list[str], min_uncached: int) -> None:
    unused = [harness.free_port() for _ in range(3)]  # nothing listens: topology only
    config = harness.write_config(tmp_path / "cfg" / "router.yaml", _docs({
        unused[0]: {"group": "a", "role": "prefill"},
        unused[1]: {"role": "decode"},  # no group label
    }))
    router = harness.start_router(config, tmp_path, workers=workers, extra_args=extra)
    try:
        views = _pd_views(router)
        assert len(views) == workers
        for v in views:
            assert v["model_server"] == "default/pd" and v["connector"] == "http"
            assert v["problem"] == "ModelServer default/pd (pdGroup) has no decode endpoint"
            assert v["ignored"] == [f"{harness.HOST}:{unused[1]}: no 'group' label (pdGroup.groupKey)",
                                    f"{harness.HOST}:{unused[0]}: group 'a' has no decode endpoint"]
            assert v["min_uncached_tokens"] == min_uncached
        assert _gauge(router, "kthena_router_pd_servable", model_server="default/pd") == 0
        assert _gauge(router, "kthena_router_pd_endpoints", model_server="default/pd", group="",
                      role="ignored") == 2

        harness.write_config(config, _docs({unused[0]: {"group": "a", "role": "prefill"},
                                            unused[1]: {"group": "a", "role": "decode"},
                                            unused[2]: {"group": "a", "role": "decode"}}))
        assert router.reload().status_code == 200
        harness.wait_until(lambda: all(v["problem"] is None for v in _pd_views(router)), 30,
                           what="every worker on the repaired topology")
        for v in _pd_views(router):
            assert v["groups"] == {"a": {"prefill": [f"{harness.HOST}:{unused[0]}"],
                                         "decode": [f"{harness.HOST}:{p}" for p in unused[1:]]}}
        assert _gauge(router, "kthena_router_pd_servable", model_server="default/pd") == 1
        assert _gauge(router, "kthena_router_pd_endpoints", model_server="default/pd", group="a",
                      role="decode") == 2
    finally:
        router.stop()
    log = router.process.stderr() + router.process.stdout()
    warned = [line for line in log.splitlines() if "WARNING" in line and "cannot serve" in line]
    assert len(warned) == workers, log[-3000:]  # once per worker, not per request or reload
    assert "has no decode endpoint" in warned[0]


def test_pd_status_without_router_config(tmp_path: Path, router_workers: int) -> None:
    _run(tmp_path, router_workers, [], 0)


def test_pd_status_with_router_config_pd_section(tmp_path: Path) -> None:
    rc = tmp_path / "rc.yaml"
    rc.write_text("pd:\n  minUncachedTokens: 32\n  servers:\n    pd: {minUncachedTokens: 64}\n")
    _run(tmp_path, 1, ["--router-config", str(rc)], 64)
