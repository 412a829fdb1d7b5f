"""SIGTERM: /readyz fails at once, in-flight streams finish within the grace period, exit.

A dedicated slow simulator (time scale 5) makes a 200-token stream last several seconds,
so that the checks made while it runs happen before it ends, even on a busy machine.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness

SLOW_TOKENS = 200


@pytest.fixture(scope="module")
def slow_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    with harness.start_simulator(tmp_path_factory.mktemp("slow-sim"), engines=1,
                                 extra_args=["--time-scale", "5"]) as sim:
        yield sim


class StreamReader(threading.Thread):
    """Reads one streamed chat completion through the openai SDK in the background."""

    def __init__(self, router: harness.Router, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.client = router.openai(timeout=300.0)
        self.max_tokens = max_tokens
        self.first_chunk = threading.Event()
        self.content_chunks = 0
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "count slowly"}],
                max_tokens=self.max_tokens, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:  # the SDK stops at [DONE] and raises on an error event
                self.first_chunk.set()
                if chunk.usage is not None:
                    self.usage = chunk.usage
                for choice in chunk.choices:
                    if choice.delta.content:
                        self.content_chunks += 1
                    if choice.finish_reason:
                        self.finish_reason = choice.finish_reason
        except BaseException as exc:  # reported to the test
            self.error = exc
        finally:
            self.first_chunk.set()


def _start(slow_simulator: harness.Simulator, tmp_path: Path, workers: int, grace: float) -> harness.Router:
    config = harness.write_config(tmp_path / "router.yaml", harness.engine_config(slow_simulator.ports))
    return harness.start_router(config, tmp_path, workers=workers, drain_grace_s=grace)


def test_sigterm_fails_readyz_refuses_new_connections_and_finishes_streams(
    slow_simulator: harness.Simulator, tmp_path: Path, router_workers: int
) -> None:
    router = _start(slow_simulator, tmp_path, router_workers, grace=300)
    try:
        assert router.readyz().status_code == 200
        reader = StreamReader(router, SLOW_TOKENS)
        reader.start()
        assert reader.first_chunk.wait(120) and reader.error is None, reader.error

        router.process.send_signal(signal.SIGTERM)

        # /readyz says "draining" while the stream is still running.
        r = harness.wait_until(lambda: (lambda r: r if r.status_code == 503 else None)(router.readyz()),
                               60, what="/readyz 503")
        assert r.json() == {"ready": False, "reason": "draining"}
        assert reader.is_alive(), "the stream ended before the checks; make it longer"
        # The listener closes: new connections are refused (in-flight ones continue).
        harness.wait_until(lambda: not harness.port_accepts(router.port), 60, what="listener closed")
        assert reader.is_alive(), "the stream ended before the checks; make it longer"
        assert router.admin_get("/healthz").status_code == 200

        reader.join(300)
        assert not reader.is_alive()
        assert reader.error is None, repr(reader.error)
        assert reader.finish_reason == "length"
        assert reader.usage is not None and reader.usage.completion_tokens == SLOW_TOKENS
        assert reader.content_chunks == SLOW_TOKENS
        assert router.process.wait(120) == 0, router.process.tail()
        # Every worker is gone with the parent.
        assert not harness.port_accepts(router.port)
        assert not harness.port_accepts(router.admin_port)
    finally:
        router.stop()


def test_grace_period_bounds_the_drain(
    slow_simulator: harness.Simulator, tmp_path: Path, router_workers: int
) -> None:
    """A stream longer than the grace period is cut and the router exits anyway."""
    router = _start(slow_simulator, tmp_path, router_workers, grace=1)
    try:
        reader = StreamReader(router, 100_000)  # hours of simulated decoding
        reader.start()
        assert reader.first_chunk.wait(120) and reader.error is None, reader.error
        router.process.send_signal(signal.SIGTERM)
        router.process.wait(120)  # raises TimeoutExpired if the grace period is not enforced
        reader.join(120)
        assert not reader.is_alive()
        assert reader.finish_reason is None  # the stream did not complete
        assert reader.error is not None
    finally:
        router.stop()


def test_second_signal_stops_at_once(
    slow_simulator: harness.Simulator, tmp_path: Path, router_workers: int
) -> None:
    router = _start(slow_simulator, tmp_path, router_workers, grace=3600)
    try:
        reader = StreamReader(router, 100_000)
        reader.start()
        assert reader.first_chunk.wait(120) and reader.error is None, reader.error
        router.process.send_signal(signal.SIGTERM)
        harness.wait_until(lambda: router.readyz().status_code == 503, 60, what="draining")
        router.process.send_signal(signal.SIGINT)
        router.process.wait(120)  # well before the hour of grace
        reader.join(120)
        assert reader.finish_reason is None and reader.error is not None
    finally:
        router.stop()
