"""Admin endpoints: /healthz, /readyz, /debug/config_dump, worker respawn."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

import harness


def test_healthz_and_readyz(router: harness.Router) -> None:
    h = router.admin_get("/healthz")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    r = router.readyz()
    assert r.status_code == 200 and r.json() == {"ready": True, "reason": "ok"}
    # Admin paths live on the admin port only.
    assert httpx.get(f"{router.base_url}/readyz", timeout=30).status_code == 404


def test_config_dump_has_routes_and_endpoints_without_secrets(
    simulator: harness.Simulator, tmp_path: Path, router_workers: int
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("sk-very-secret\n")
    docs = harness.engine_config(simulator.ports)
    docs[1]["metadata"]["annotations"] = {"router.kthena.io/upstream-token-file": str(token_file)}
    config = harness.write_config(tmp_path / "cfg" / "router.yaml", docs)
    router = harness.start_router(config, tmp_path, workers=router_workers)
    try:
        r = router.admin_get("/debug/config_dump")
        assert r.status_code == 200
        assert "sk-very-secret" not in r.text
        dump = r.json()
        assert [route["model_name"] for route in dump["routes"]] == ["demo"]
        (server,) = dump["servers"]
        assert server["upstream_headers"] == {"Authorization": "<redacted>"}
        assert sorted(ep["port"] for ep in server["endpoints"]) == sorted(simulator.ports)
        assert len(dump["workers"]) == router_workers
    finally:
        router.stop()


def test_killed_worker_is_respawned(simulator: harness.Simulator, tmp_path: Path, router_workers: int) -> None:
    config = harness.write_config(tmp_path / "cfg" / "router.yaml", harness.engine_config(simulator.ports))
    router = harness.start_router(config, tmp_path, workers=router_workers)
    try:
        old = router.worker_pids()
        os.kill(old[0], signal.SIGKILL)
        status = router.runtime_dir / f"worker-{old[0]}.json"
        # The reaper is periodic: wait for it too (it removes the dead worker's status file).
        harness.wait_until(lambda: router.readyz().status_code == 200 and old[0] not in router.worker_pids()
                           and len(router.worker_pids()) == router_workers and not status.exists(),
                           120, interval=0.2, what="a respawned worker and its predecessor reaped")
        reply = router.openai().chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.choices[0].finish_reason
        assert router.process.alive()
    finally:
        router.stop()
