"""Config and inspection helpers for the prefill/decode integration tests (tests/integration/test_pd_*.py)."""

from __future__ import annotations

from typing import Any

import harness

PD_GROUP = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}


def pd_server(name: str, match: dict[str, str], *, engine: str = "vLLM", connector: str | None = None,
              retry_attempts: int | None = None) -> dict[str, Any]:
    doc = harness.server_doc(name, "demo", match, engine=engine, retry_attempts=retry_attempts,
                             retry_interval="0s" if retry_attempts is not None else None)
    doc["spec"]["workloadSelector"]["pdGroup"] = dict(PD_GROUP)
    if connector is not None:
        doc["spec"]["kvConnector"] = {"type": connector}
    return doc


def endpoints(name: str, eps: list[tuple[int, dict[str, str], int | None]]) -> dict[str, Any]:
    """An Endpoints document: (port, labels, bootstrapPort or None) per endpoint."""
    out = []
    for port, labels, boot in eps:
        e: dict[str, Any] = {"address": harness.HOST, "port": port, "labels": dict(labels)}
        if boot is not None:
            e["bootstrapPort"] = boot
        out.append(e)
    return {"apiVersion": harness.ENDPOINTS_API, "kind": "Endpoints", "metadata": {"name": name},
            "spec": {"endpoints": out}}


def entries(sim: harness.Simulator, engine: int, rid: str) -> list[dict[str, Any]]:
    return [e for e in sim.requests(engine)["log"] if e["request_id"] == rid]


def hops(sim: harness.Simulator, rid: str) -> dict[int, list[dict[str, Any]]]:
    """Engine index -> its log entries of request `rid` (engines that saw it only)."""
    out = {}
    for i in range(len(sim.ports)):
        got = entries(sim, i, rid)
        if got:
            out[i] = got
    return out


def pd_state(sim: harness.Simulator, engine: int) -> dict[str, Any]:
    return sim.state(engine)["pd"]


def wait_entry(sim: harness.Simulator, engine: int, rid: str, statuses: tuple[str, ...],
               timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        for e in entries(sim, engine, rid):
            if e["status"] in statuses:
                return e
        return None

    try:
        return harness.wait_until(done, timeout, interval=0.1, what=f"engine {engine}: {rid} in {statuses}")
    except TimeoutError:
        raise AssertionError(f"engine {engine} log of {rid}: {entries(sim, engine, rid)}") from None


def metric(router: harness.Router, name: str, **labels: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), name, **labels)


def sse_lines(router: harness.Router, http: Any, model: str, rid: str, **body: Any) -> list[str]:
    """A raw streamed chat completion's `data:` lines (to see error events and [DONE])."""
    req = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "stream": True, **body}
    with http.stream("POST", f"{router.openai_url}/chat/completions", json=req,
                     headers={"X-Request-ID": rid}) as resp:
        assert resp.status_code == 200, resp.read()
        return [line for line in resp.iter_lines() if line.startswith("data:")]
