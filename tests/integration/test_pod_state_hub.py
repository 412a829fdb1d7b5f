"""The pod-state hub (docs/pod-state.md) with a real router of 3 workers in front of real
simulator engines: probes and scrapes per engine do not grow with the worker count, every
worker's prefix index gets every worker's inserts, a restarted worker gets the pod's
index, and a killed hub neither hangs the workers nor stays dead."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness
from loadtest.pod_state_polls import KINDS, count_polls, poller_args

WORKERS = 3
INTERVAL_S = 0.25  # scrape and probe period: many polls in a short window


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    s = harness.start_simulator(tmp_path_factory.mktemp("podstate-sim"), engines=2, extra_args=["--seed", "3"])
    try:
        yield s
    finally:
        s.stop()


def _start(sim: harness.Simulator, tmp: Path, workers: int, *extra: str) -> harness.Router:
    config = harness.write_config(tmp / "cfg" / "routes.yaml", harness.engine_config(sim.ports))
    return harness.start_router(config, tmp, workers=workers, extra_args=[*poller_args(tmp, INTERVAL_S), *extra])


@pytest.fixture(scope="module")
def router(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    r = _start(sim, tmp_path_factory.mktemp("podstate-router"), WORKERS)
    try:
        wait_modes(r, "hub")
        yield r
    finally:
        r.stop()


def statuses(router: harness.Router) -> list[dict[str, Any]]:
    out = []
    for path in router.runtime_dir.glob("worker-*.json"):
        try:
            st = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(st["pid"], 0)
        except ProcessLookupError:
            continue
        out.append(st)
    return out


def wait_modes(router: harness.Router, mode: str, n: int = WORKERS) -> None:
    harness.wait_until(lambda: [s.get("pod_state") for s in statuses(router)] == [mode] * n, 60,
                       what=f"{n} workers in pod-state mode {mode!r}")


def polls(sim: harness.Simulator) -> list[dict[str, int]]:
    return [sim.state(i)["polls"] for i in range(len(sim.ports))]


def views(router: harness.Router) -> list[dict[str, Any]]:
    r = router.admin_get("/debug/pod_state")
    assert r.status_code == 200, r.text
    return list(r.json()["workers"])


def hub_pid(router: harness.Router) -> int:
    return int((router.runtime_dir / "pod-state-hub.pid").read_text())


def chat(router: harness.Router, prompt: str) -> None:
    # a new connection per request: granian's workers take turns accepting them
    with httpx.Client(timeout=60) as c:
        r = c.post(router.base_url + "/v1/chat/completions", json={
            "model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": prompt}]})
    assert r.status_code == 200, r.text


def test_probes_and_scrapes_per_engine_do_not_grow_with_workers(router: harness.Router,
                                                                 sim: harness.Simulator) -> None:
    counts, window = count_polls(lambda: polls(sim), 4.0)
    # One poller per pod: at most one request per interval (+10 % jitter), plus the rounds
    # already in flight at both ends. Every worker polling on its own would be ~WORKERS x.
    bound = 1.2 * window / INTERVAL_S + 3
    for c in counts:
        for kind in KINDS:
            n = c[kind]
            assert 0 < n <= bound, f"{kind}: {n} requests in {window:.1f}s (one poller: <= {bound:.0f})"


def test_every_worker_index_gets_every_insert(router: harness.Router) -> None:
    prompt = "the shared system prompt of one tenant, long enough for many blocks. " * 40
    for i in range(12):
        chat(router, prompt + f" question {i}")

    def synced() -> list[dict[str, Any]] | None:
        vs = views(router)
        indexes = [v["index"] for v in vs]
        if len(vs) == WORKERS and all(ix == indexes[0] for ix in indexes) and sum(indexes[0].values()) > 0:
            return vs
        return None

    vs = harness.wait_until(synced, 30, what="identical prefix indexes in every worker")
    assert all(v["mode"] == "hub" for v in vs)
    # whichever workers served them (granian picks), the others got their inserts relayed
    assert any(v["inserts_sent"] > 0 for v in vs), vs
    assert sum(v["inserts_applied"] for v in vs) > 0, vs


def test_restarted_worker_gets_the_pods_index(router: harness.Router) -> None:
    chat(router, "another tenant's prompt, to have something in the index. " * 30)
    harness.wait_until(lambda: len({json.dumps(v["index"]) for v in views(router)}) == 1, 30,
                       what="identical indexes")
    expected = views(router)[0]["index"]
    victim = statuses(router)[0]["pid"]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        pids = [s["pid"] for s in statuses(router)]
        return victim not in pids and len(pids) == WORKERS and all(
            s.get("pod_state") == "hub" for s in statuses(router))

    harness.wait_until(replaced, 60, what="granian respawned the killed worker, connected to the hub")
    new = [v for v in views(router) if v["pid"] != victim]
    assert len(new) == WORKERS
    # the replay log: the respawned worker's index holds what the others' hold
    harness.wait_until(lambda: all(v["index"] == expected for v in views(router)), 30,
                       what="the respawned worker's index equals the others'")


def test_killed_hub_restarts_and_workers_never_hang(router: harness.Router, sim: harness.Simulator) -> None:
    old = hub_pid(router)
    os.kill(old, signal.SIGKILL)
    # requests right after: served (decisions never wait on the hub)
    for i in range(4):
        chat(router, f"served while the hub is down {i}")
    harness.wait_until(lambda: hub_pid(router) != old, 30, what="the supervisor restarted the hub")
    wait_modes(router, "hub")
    log = router.process.stderr()
    assert "restarting it" in log
    assert log.count("pod-state hub connection lost") >= WORKERS
    # and the new hub polls the engines: probes keep coming
    before = polls(sim)
    harness.wait_until(lambda: all(a["health"] > b["health"] for a, b in zip(polls(sim), before)), 30,
                       what="probes from the new hub")


def test_one_worker_runs_no_hub(sim: harness.Simulator, tmp_path: Path) -> None:
    r = _start(sim, tmp_path, 1)
    try:
        chat(r, "one worker keeps everything in-process")
        assert not (r.runtime_dir / "pod-state-hub.pid").exists()
        assert [s.get("pod_state") for s in statuses(r)] == [""]
        assert r.admin_get("/debug/pod_state").status_code == 404
    finally:
        r.stop()


def test_pod_state_off_keeps_every_worker_on_its_own(sim: harness.Simulator, tmp_path: Path) -> None:
    r = _start(sim, tmp_path, 2, "--pod-state", "off")
    try:
        chat(r, "two workers, no hub")
        assert not (r.runtime_dir / "pod-state-hub.pid").exists()
        assert [s.get("pod_state") for s in statuses(r)] == ["", ""]
    finally:
        r.stop()
