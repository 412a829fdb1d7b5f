"""A client that goes away cancels the upstream request (the engine records it aborted)."""

from __future__ import annotations

import uuid

import harness
import httpx
import pytest

MSGS = [{"role": "user", "content": "write a long story"}]


def _entry(sim: harness.Simulator, rid: str) -> dict | None:
    for i in range(len(sim.ports)):
        for e in sim.requests(i)["log"]:
            if e["request_id"] == rid:
                return e
    return None


def _wait_status(sim: harness.Simulator, rid: str, statuses: tuple[str, ...]) -> dict:
    def done() -> dict | None:
        e = _entry(sim, rid)
        return e if e is not None and e["status"] in statuses else None

    try:
        return harness.wait_until(done, 30, interval=0.1, what=f"request {rid} in {statuses}")
    except TimeoutError:
        raise AssertionError(f"engine log entry: {_entry(sim, rid)}") from None



def test_disconnect_cancels_streaming(router: harness.Router, simulator: harness.Simulator) -> None:
    rid = uuid.uuid4().hex
    body = {"model": "demo", "messages": MSGS, "max_tokens": 4000, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions", json=body,
                         headers={"X-Request-ID": rid}) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            got = [line for _, line in zip(range(6), lines)]
            assert any(line.startswith("data: ") for line in got)
        # leaving the block closes the connection mid-stream
    entry = _wait_status(simulator, rid, ("aborted",))
    assert entry["tokens_out"] < 4000


def test_disconnect_cancels_non_streaming(router: harness.Router, simulator: harness.Simulator) -> None:
    rid = uuid.uuid4().hex
    body = {"model": "demo", "messages": MSGS, "max_tokens": 4000}
    with httpx.Client(timeout=httpx.Timeout(60, read=1.5)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{router.openai_url}/chat/completions", json=body, headers={"X-Request-ID": rid})
    _wait_status(simulator, rid, ("aborted",))


def test_disconnect_cancels_stalled_upstream(router: harness.Router, simulator: harness.Simulator) -> None:
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, stall=True)
    rid = uuid.uuid4().hex
    body = {"model": "demo", "prompt": "x", "max_tokens": 5}
    with httpx.Client(timeout=httpx.Timeout(60, read=1.5)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{router.openai_url}/completions", json=body, headers={"X-Request-ID": rid})
    _wait_status(simulator, rid, ("aborted",))
    assert sum(simulator.received()) == 1  # the stall was not retried after the client left
