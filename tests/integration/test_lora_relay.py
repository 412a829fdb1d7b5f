"""Several workers: lora-affinity's view of the adapters in an engine's batch includes the
sibling workers' requests, relayed by the pod-state hub (the first worker's +1 reaches the
second as `lora_remote`, its end as -1), so a worker does not see a full batch as free."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness

ADAPTERS = ("ad-a", "ad-b")
SCHED = """\
scheduler:
  plugins:
    Score:
      enabled:
      - {name: least-request, weight: 1}
      - {name: lora-affinity, weight: 4}
"""


def _views(router: harness.Router) -> list[dict[str, Any]]:
    """Per worker, endpoint key -> its signals (the one server)."""
    r = router.admin_get("/debug/scheduler")
    r.raise_for_status()
    out = []
    for w in r.json()["workers"]:
        servers = w.get("servers") or {}
        out.append(next(iter(servers.values())) if servers else {})
    return out


def _counts(router: harness.Router, kind: str) -> list[dict[str, dict[str, int]]]:
    return [{k: e[kind] for k, e in v.items() if e.get(kind)} for v in _views(router)]


def test_a_siblings_adapter_requests_count_in_the_batch_view(tmp_path: Path) -> None:
    sim = harness.start_simulator(tmp_path, engines=2, lora=ADAPTERS)
    config = harness.write_config(tmp_path / "config.yaml", harness.engine_config(sim.ports, lora=ADAPTERS))
    sched = harness.write_config(tmp_path / "sched.yaml", SCHED)
    router = harness.start_router(config, tmp_path, workers=2, extra_args=["--router-config", str(sched)])
    try:
        harness.wait_until(lambda: len(_views(router)) == 2, 30, what="two workers")
        harness.wait_until(lambda: all(w["mode"] == "hub"
                                       for w in router.admin_get("/debug/pod_state").json()["workers"]),
                           30, what="both workers on the hub")
        client = router.openai(max_retries=0, timeout=120)
        stream = client.chat.completions.create(model="ad-a", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4000, stream=True)
        try:
            first = next(iter(stream))  # dispatched and running
            assert first is not None
            own = harness.wait_until(lambda: [c for c in _counts(router, "lora_in_flight") if c] or None, 30,
                                     what="the dispatching worker's own count")
            assert own == [{next(iter(own[0])): {"ad-a": 1}}]
            (ep,) = own[0]
            harness.wait_until(lambda: [c for c in _counts(router, "lora_remote") if c] == [{ep: {"ad-a": 1}}], 30,
                               what="the sibling's relayed count")
        finally:
            stream.close()
        harness.wait_until(lambda: not any(_counts(router, "lora_in_flight") + _counts(router, "lora_remote")),
                           30, what="both counts released after the stream ended")
    finally:
        router.stop()
        sim.stop()
