"""`make run` (python -m loadtest.demo): starts, answers the printed curl request, stops on Ctrl-C."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import httpx

import harness


def _demo(tmp_path: Path, ports: list[int]) -> harness.ManagedProcess:
    router, admin, e1, e2, e3, sim_admin = ports
    return harness.ManagedProcess("demo", [
        harness.PYTHON, "-m", "loadtest.demo", "--port", str(router), "--admin-port", str(admin),
        "--engine-ports", f"{e1},{e2},{e3}", "--sim-admin-port", str(sim_admin),
    ], tmp_path)


def test_demo_starts_serves_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    ports = harness.free_ports(6)
    demo = _demo(tmp_path, ports)
    try:
        harness.wait_until(lambda: "Press Ctrl-C" in demo.stdout() or not demo.alive(), 180,
                           interval=0.2, what="the demo banner")
        assert demo.alive(), demo.tail()
        out = demo.stdout()
        # The printed curl line works as printed (same URL and body).
        m = re.search(r"curl -s (http://\S+/v1/chat/completions) -H 'Content-Type: application/json' -d '(\{.*?\})'",
                      out)
        assert m, out
        r = httpx.post(m.group(1), content=m.group(2), headers={"Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert f"http://127.0.0.1:{ports[1]}/metrics" in out
        assert httpx.get(f"http://127.0.0.1:{ports[1]}/metrics", timeout=30).status_code == 200

        demo.send_signal(signal.SIGINT)  # what Ctrl-C sends to the launcher
        assert demo.wait(120) == 0, demo.tail()
        assert "stopped" in demo.stdout()
        for port in ports:  # router, admin, engines, simulator admin: all closed
            assert not harness.port_accepts(port), port
        assert "Traceback" not in demo.stderr(), demo.stderr()
    finally:
        demo.kill_group()


def test_demo_reports_a_taken_port(tmp_path: Path) -> None:
    ports = harness.free_ports(6)
    with socket.socket() as blocker:
        blocker.bind((harness.HOST, ports[0]))
        blocker.listen()
        demo = _demo(tmp_path, ports)
        try:
            assert demo.wait(60) == 1
        finally:
            demo.kill_group()
    assert f"router port {ports[0]}" in demo.stderr() and "already in use" in demo.stderr()
    assert "Traceback" not in demo.stderr()
