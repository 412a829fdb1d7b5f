"""A real L4 balancer (Debian's haproxy) in front of several router replicas, for tests.

The configuration and binary come from loadtest/haproxy.py (shared with the benchmarks);
this module runs it under the tests' process manager.

`make test` installs haproxy when it is missing (Makefile target `haproxy`). The balancer
runs in the foreground (`-db`: no daemon, no master process) with its own config file in
the test's log directory, TCP mode (it never parses HTTP), `balance roundrobin`: each new
client connection goes to the next replica, so requests sent on new connections spread over
every replica, as behind a Kubernetes Service or a cloud L4 load balancer.

Import as `import haproxy_harness` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import harness
from loadtest.haproxy import HAPROXY, render_config

__all__ = ["HAPROXY", "Haproxy", "render_config", "start_haproxy"]


class Haproxy:
    def __init__(self, log_dir: Path, backends: Sequence[int], port: int | None = None) -> None:
        self.log_dir = log_dir
        self.backends = list(backends)
        self.port = port or harness.free_port()
        self.config_path = log_dir / f"haproxy-{self.port}.cfg"
        self.process: harness.ManagedProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://{harness.HOST}:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"

    def start(self, timeout: float = 30.0) -> Haproxy:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(render_config(self.port, self.backends))
        check = harness.ManagedProcess("haproxy-check", [HAPROXY, "-c", "-f", str(self.config_path)], self.log_dir)
        if check.wait(30) != 0:
            raise RuntimeError(f"haproxy rejected its config\n{check.tail()}")
        self.process = harness.ManagedProcess("haproxy", [HAPROXY, "-db", "-f", str(self.config_path)], self.log_dir)
        harness.wait_until(self._up, timeout, what=f"haproxy on {self.port}")
        return self

    def _up(self) -> bool:
        assert self.process is not None
        if not self.process.alive():
            raise RuntimeError(f"haproxy exited with {self.process.returncode}\n{self.process.tail()}")
        return harness.port_accepts(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start_haproxy(log_dir: Path, backends: Sequence[int]) -> Haproxy:
    return Haproxy(log_dir, backends).start()
