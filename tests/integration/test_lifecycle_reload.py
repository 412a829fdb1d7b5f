"""Config reload: POST /admin/reload (good and bad files) and reload on file change."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

import harness

RELOAD_FAILURES = "kthena_router_config_reloads_total"


def _models(router: harness.Router) -> set[str]:
    r = httpx.get(f"{router.openai_url}/models", timeout=30)
    r.raise_for_status()
    return {m["id"] for m in r.json()["data"]}


def _two_models(ports: list[int]) -> list[dict]:
    docs = harness.engine_config(ports)
    docs.insert(1, harness.route_doc("second", "demo-two", "demo"))
    return docs


def _admin_failures(router: harness.Router) -> float:
    fams = harness.parse_metrics(router.metrics_text())
    return harness.metric_value(fams, RELOAD_FAILURES, result="failure", trigger="admin")


@pytest.fixture
def own_router(simulator: harness.Simulator, tmp_path: Path, router_workers: int) -> harness.Router:
    config = harness.write_config(tmp_path / "cfg" / "router.yaml", harness.engine_config(simulator.ports))
    router = harness.start_router(config, tmp_path, workers=router_workers)
    yield router
    router.stop()


def test_admin_reload_good_file_serves_new_route(own_router: harness.Router, simulator: harness.Simulator) -> None:
    router = own_router
    client = router.openai()
    assert "demo-two" not in _models(router)
    # A stream in flight across the reload is not dropped.
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=64, stream=True)
    chunks = iter(stream)
    next(chunks)

    harness.write_config(router.config_path, _two_models(simulator.ports))
    r = router.reload()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["applied"] is True and body["pending"] == []
    assert len(body["workers"]) == router.workers
    assert sorted(body["workers"]) == sorted(router.worker_pids())

    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert "demo-two" in _models(router)
    reply = client.chat.completions.create(model="demo-two", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4)
    assert reply.choices[0].message.content
    dump = router.admin_get("/debug/config_dump").json()
    assert dump["digest"] == body["digest"]
    assert {w["digest"] for w in dump["workers"]} == {body["digest"]}


def test_admin_reload_bad_file_keeps_old_config(own_router: harness.Router, simulator: harness.Simulator) -> None:
    router = own_router
    before = _admin_failures(router)
    docs = _two_models(simulator.ports)
    docs[1]["spec"]["rules"][0]["targetModels"][0]["weight"] = 500  # route "second"
    harness.write_config(router.config_path, docs)

    r = router.reload()
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["file"] == str(router.config_path)
    assert "document 2" in err["document"] and "second" in err["document"]
    assert err["field"] == "spec.rules[0].targetModels[0].weight"
    assert "weight" in err["message"]

    # The old config still serves; the failure is counted once and logged by the parent.
    assert "demo-two" not in _models(router)
    reply = router.openai().chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4)
    assert reply.choices[0].finish_reason
    assert _admin_failures(router) == before + 1
    harness.wait_until(lambda: "spec.rules[0].targetModels[0].weight" in router.process.stderr(), 30,
                       what="the rejected reload in the log")
    assert router.readyz().status_code == 200


def test_file_change_reloads_without_restart(simulator: harness.Simulator, tmp_path: Path,
                                             router_workers: int) -> None:
    config = harness.write_config(tmp_path / "cfg" / "router.yaml", harness.engine_config(simulator.ports))
    router = harness.start_router(config, tmp_path, workers=router_workers)
    try:
        pids = router.worker_pids()
        harness.write_config(config, _two_models(simulator.ports))  # rename-replace, like editors
        digest = hashlib.sha256(config.read_bytes()).hexdigest()

        def all_applied() -> bool:
            workers = router.admin_get("/debug/workers").json()["workers"]
            return len(workers) == router.workers and all(w["digest"] == digest for w in workers)

        harness.wait_until(all_applied, 60, interval=0.1, what="every worker on the new config")
        for _ in range(4 * router.workers):  # fresh connections: spread over the workers
            assert "demo-two" in _models(router)
        assert router.worker_pids() == pids  # reloaded in place, not restarted
    finally:
        router.stop()
