"""The simulator process itself: ready line, ports, signals, start-up errors, sockets."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from conftest import HOST, REPO, start_simulator


def test_ready_line_ports_and_sigterm_exit(sim_factory):
    s = start_simulator("--fast", engines=3)
    try:
        assert len(set(s.ports)) == 3 and s.admin_port not in s.ports
        for i in range(3):
            assert httpx.get(s.url(i) + "/health").status_code == 200
        engines = s.admin.get("/admin/engines").json()
        assert [e["port"] for e in engines] == s.ports and all(e["fast"] for e in engines)
    finally:
        s.stop()
    assert s.proc.returncode == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.url(0) + "/health")


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "loadtest.simulator", "--fast", "--ports",
                            str(port), "--admin-port", "0"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert p.returncode == 1 and "in use" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("args,msg", [
    (["--ports", "0,0"], "--ports lists 2 ports for 1 engines"),
    (["--faults", "{bad"], "--faults"),
    (["--lora", "a", "b", "--max-loras", "1"], "exceed --max-loras"),
])
def test_bad_arguments(args, msg):
    p = subprocess.run([sys.executable, "-m", "loadtest.simulator", "--fast", *args],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and msg in p.stderr


def test_refusing_from_the_start_and_nodelay(sim_factory):
    s = sim_factory("--fast", "--faults", '{"1": {"refuse_connections": true}}', engines=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.url(1) + "/health")
    # the refusing engine keeps its port: nothing else can take it meanwhile
    with socket.socket() as other, pytest.raises(OSError):
        other.bind((HOST, s.ports[1]))
    body = {"model": "demo", "prompt": "x", "max_tokens": 2}
    assert httpx.post(s.url(0) + "/v1/completions", json=body).status_code == 200
    # the engine's accepted sockets have TCP_NODELAY (set by aiohttp on accept)
    assert s.requests(0)["log"][0]["tcp_nodelay"] is True
    s.faults(1, refuse_connections=False)
    assert httpx.get(s.url(1) + "/health").status_code == 200


def test_detokenize_rejects_bad_ids(sim_factory):
    s = sim_factory("--fast")
    for tokens in ([-1], [10**9], ["a"], "x"):
        r = httpx.post(s.url(0) + "/detokenize", json={"model": "demo", "tokens": tokens})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_sigterm_with_an_open_stream_exits_promptly():
    s = start_simulator("--time-scale", "1")
    try:
        body = {"model": "demo", "prompt": "x", "max_tokens": 100000, "stream": True}
        with httpx.stream("POST", s.url(0) + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            s.proc.terminate()
            rest = list(lines)  # the stream ends (finish_reason "abort") instead of hanging
        assert s.proc.wait(timeout=30) == 0
        assert any('"finish_reason":"abort"' in ln for ln in rest), rest[-3:]
    finally:
        s.stop()


def test_fast_mode_latency_settings_are_lower_bounds(sim_factory):
    import time

    s = sim_factory("--fast", "--fast-ttft-ms", "50", "--fast-itl-ms", "20")
    body = {"model": "demo", "prompt": "x", "max_tokens": 6, "stream": True}
    t0 = time.monotonic()
    with httpx.stream("POST", s.url(0) + "/v1/completions", json=body, timeout=60) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    elapsed = time.monotonic() - t0
    assert len(lines) == 7 and lines[-1] == "data: [DONE]"
    assert elapsed >= 0.05 + 5 * 0.02  # ttft + 5 gaps; only a lower bound is safe to assert
