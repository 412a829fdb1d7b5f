"""Start the engine simulator as a real process on loopback, on free ports.

`start_simulator(*args)` runs `python -m loadtest.simulator` with `--ports 0,...` and
`--admin-port 0` (the OS picks free ports, no race), waits for its ready line and
returns a `SimProcess`. The `sim_factory` fixture stops every process it started.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0


@dataclass
class SimProcess:
    proc: subprocess.Popen
    ports: list[int]
    admin_port: int
    stderr_path: str
    admin: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.admin = httpx.Client(base_url=f"http://{HOST}:{self.admin_port}", timeout=30.0)

    def url(self, i: int = 0) -> str:
        return f"http://{HOST}:{self.ports[i]}"

    # admin helpers
    def faults(self, i: int | str = 0, **patch: Any) -> dict[str, Any]:
        r = self.admin.post(f"/admin/engines/{i}/faults", json=patch)
        r.raise_for_status()
        return r.json()

    def reset(self) -> None:
        self.admin.post("/admin/engines/*/faults/reset").raise_for_status()
        self.admin.post("/admin/engines/*/requests/reset").raise_for_status()

    def requests(self, i: int = 0) -> dict[str, Any]:
        r = self.admin.get(f"/admin/engines/{i}/requests")
        r.raise_for_status()
        return r.json()

    def state(self, i: int = 0) -> dict[str, Any]:
        r = self.admin.get(f"/admin/engines/{i}/state")
        r.raise_for_status()
        return r.json()

    def wait_for(self, pred: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
        """Poll `pred` until it returns something truthy (with a deadline, no fixed sleep)."""
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or pred}")
            time.sleep(0.02)

    def stderr(self) -> str:
        try:
            return Path(self.stderr_path).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        self.admin.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if self.proc.stdout:
            self.proc.stdout.close()
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


def start_simulator(*args: str, engines: int = 1) -> SimProcess:
    argv = list(args)
    if "--engines" not in argv:
        argv += ["--engines", str(engines)]
    else:
        engines = int(argv[argv.index("--engines") + 1])
    if "--ports" not in argv:
        argv += ["--ports", ",".join("0" * engines)]
    if "--admin-port" not in argv:
        argv += ["--admin-port", "0"]
    if "--host" not in argv:
        argv += ["--host", HOST]
    fd, err_path = tempfile.mkstemp(prefix="sim-stderr-", suffix=".log")
    with os.fdopen(fd, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "loadtest.simulator", *argv], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=err)
    try:
        line = _read_line(proc, READY_TIMEOUT_S)
        ready = json.loads(line)
        assert ready.get("ready") is True, line
    except BaseException:
        proc.kill()
        proc.wait(timeout=15)
        msg = Path(err_path).read_text(errors="replace")
        os.unlink(err_path)
        raise RuntimeError(f"simulator did not start: {msg[-2000:]}") from None
    return SimProcess(proc, ready["ports"], ready["admin_port"], err_path)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError("no ready line")
            if sel.select(min(left, 0.5)):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError("stdout closed")
                buf += chunk
    finally:
        sel.close()
    return buf.split(b"\n", 1)[0].decode()


@pytest.fixture(scope="module")
def sim_factory() -> Iterator[Callable[..., SimProcess]]:
    started: list[SimProcess] = []

    def factory(*args: str, engines: int = 1) -> SimProcess:
        sim = start_simulator(*args, engines=engines)
        started.append(sim)
        return sim

    try:
        yield factory
    finally:
        for sim in started:
            sim.stop()
