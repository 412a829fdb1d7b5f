"""Loopback ports that this process picks and a child process binds later.

A port is free when picked, but the child binds it a moment (or seconds) later. Two things
can take it in between, and CI has lost tests to both:
- the kernel's automatic bind (an outgoing connection's source port, or a `bind(port 0)`),
  which draws from the ephemeral range;
- this process's next pick, when the kernel hands the same just-closed port out again.

So ports come from below the ephemeral range, where no automatic bind reaches, and each
process walks that range from a random start without handing a port out twice until it
wraps. Processes picking at once start far apart, so their walks do not meet in practice.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

HOST = "127.0.0.1"
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatic binds; Linux's default where it cannot be read."""
    try:
        low, high = (int(v) for v in _PORT_RANGE_FILE.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def pool_range() -> tuple[int, int]:
    """[low, high) outside the ephemeral range: below it when there is room, else above."""
    low, high = ephemeral_range()
    if low - 10000 >= 4096:
        return 10000, low
    return high + 1, 65536


def bindable(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class PortPool:
    """Hands out ports of [low, high) in order from a start, skipping any in use now."""

    def __init__(self, low: int, high: int, start: int | None = None, host: str = HOST) -> None:
        if high - low < 2:
            raise ValueError(f"port pool [{low}, {high}) is too small")
        self.low, self.high, self.host = low, high, host
        self._next = start if start is not None else random.Random().randrange(low, high)
        self._lock = threading.Lock()

    def take(self, n: int, consecutive: bool = False) -> list[int]:
        """n distinct ports free now; with consecutive, n adjacent ones (p, p+1, ...)."""
        if n < 1 or n > self.high - self.low:
            raise ValueError(f"cannot take {n} ports from [{self.low}, {self.high})")
        with self._lock:
            taken: list[int] = []
            for _ in range(self.high - self.low):
                port = self._next
                self._next = port + 1 if port + 1 < self.high else self.low
                if consecutive and taken and port != taken[-1] + 1:
                    taken = []  # wrapped: a block cannot span the pool's ends
                if bindable(port, self.host):
                    taken.append(port)
                    if len(taken) == n:
                        return taken
                elif consecutive:
                    taken = []
            raise OSError(f"no {n} free{' consecutive' if consecutive else ''} ports in "
                          f"[{self.low}, {self.high}) on {self.host}")


_POOL: tuple[int, PortPool] | None = None  # (pid that made it, pool)
_POOL_LOCK = threading.Lock()


def _pool() -> PortPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():  # a forked child walks from its own start
            _POOL = (os.getpid(), PortPool(*pool_range()))
        return _POOL[1]


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports for child processes to bind."""
    return _pool().take(n)


def free_port_block(n: int) -> int:
    """First of n consecutive free loopback ports (the simulator's KV-event ports are
    base + 2*i and +1, so they must be adjacent)."""
    return _pool().take(n, consecutive=True)[0]
