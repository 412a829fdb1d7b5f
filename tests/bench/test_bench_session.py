"""Per-request cost of session stickiness with the memory store (pytest-benchmark): the
lookup after the route match plus the record at the response start, for a pinned key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from kthena_router.config.model import ModelRoute, SessionKeySource, SessionSticky
from kthena_router.metrics import RouterMetrics
from kthena_router.session import SessionAffinity


class _Ep:
    def __init__(self, key: str) -> None:
        self.key = key


ROUTE = ModelRoute("default", "demo", "demo", (), (), None, None, 0, (),
                   SessionSticky((SessionKeySource("Header", "x-session-id"),), 600))
TARGETS = [_Ep(f"10.0.0.{i}:8000") for i in range(8)]


def _drive(coro: Any) -> Any:
    try:  # the memory store never suspends: run the coroutine without a loop
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("lookup suspended")


def test_bench_sticky_hit_memory(benchmark: Any, tmp_path: Path) -> None:
    aff = SessionAffinity(str(tmp_path), RouterMetrics(CollectorRegistry()), lambda: None)
    headers = {"x-session-id": "conversation-42", "content-type": "application/json"}
    first = _drive(aff.lookup(ROUTE, headers, [], b"", {}, TARGETS))
    aff.record(first, TARGETS[3].key)

    def one() -> Any:
        pin = _drive(aff.lookup(ROUTE, headers, [], b"", {}, TARGETS))
        aff.record(pin, pin.preferred.key)
        return pin

    assert benchmark(one).preferred is TARGETS[3]
