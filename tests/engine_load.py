"""Background load for tests: N threads, each sending one request after another until
stopped. With an engine simulator running one sequence at a time (`--max-num-seqs 1`),
N threads keep about N - 1 requests in its waiting queue (`vllm:num_requests_waiting`).

`stop()` sets the flag and joins every thread: each finishes the request it is in, so
a test must keep its requests short enough to drain within the join timeout.

Import as `import engine_load` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx


class Load:
    def __init__(self, send: Callable[[], Any], threads: int) -> None:
        """`send()` makes one request; it raises on failure (every failure is recorded)."""
        self.send = send
        self.ok = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"load-{i}", daemon=True) for i in range(threads)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.send()
            except BaseException as exc:  # noqa: BLE001 - every failure counts
                with self._lock:
                    self.errors.append(exc)
            else:
                with self._lock:
                    self.ok += 1

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"load threads still running after {timeout} s: {alive}"

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def completions(url: str, max_tokens: int, model: str = "demo") -> Callable[[], None]:
    """One non-streaming completion straight to an engine at `url` (http://host:port)."""
    def send() -> None:
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": max_tokens},
                       timeout=httpx.Timeout(10, read=120))
        r.raise_for_status()
    return send
