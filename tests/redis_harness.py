"""A real Redis server (Debian's redis-server) on a free loopback port, for tests.

`make test` installs redis-server when it is missing (Makefile target `redis-server`).
No persistence, no config file: the server lives in the test's log directory and dies
with it. `kill()` and `restart()` (same port) are for fail-open / fail-closed tests.

Import as `import redis_harness` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

import shutil
import signal
import socket
from pathlib import Path

import harness

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _ping(port: int) -> bool:
    try:
        with socket.create_connection((harness.HOST, port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.log_dir = log_dir
        self.port = port or harness.free_port()
        self.process: harness.ManagedProcess | None = None

    @property
    def address(self) -> str:
        """host:port, as Kthena's `global.redis.address` takes it."""
        return f"{harness.HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def start(self, timeout: float = 30.0) -> RedisServer:
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", harness.HOST, "--save", "",
                "--appendonly", "no", "--dir", str(self.log_dir), "--protected-mode", "no"]
        self.process = harness.ManagedProcess("redis", argv, self.log_dir)
        harness.wait_until(lambda: self._up(), timeout, what=f"redis-server on {self.port}")
        return self

    def _up(self) -> bool:
        assert self.process is not None
        if not self.process.alive():
            raise RuntimeError(f"redis-server exited with {self.process.returncode}\n{self.process.tail()}")
        return _ping(self.port)

    def kill(self) -> None:
        """SIGKILL: clients see connection resets, as when a Redis pod dies."""
        if self.process is not None:
            self.process.stop(signal.SIGKILL, timeout=5)

    def restart(self) -> RedisServer:
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start_redis(log_dir: Path) -> RedisServer:
    return RedisServer(log_dir).start()
