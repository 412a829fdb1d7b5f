"""The Python half of one Rust-front fast-path request (docs/rust-front.md, "Python per
request"): decide + (first byte) + done + the wake-ups' flushes, on a real worker
(loadtest/front_decide_cost.py) with the Rust `_core.Front` replaced at its boundary.
Plain and streamed, round-robin (no router configuration) and prefix-cache. Run with
--benchmark-only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import values

from loadtest.front_decide_cost import CASES, _case, one, worker


@pytest.mark.parametrize("case", CASES)
def test_bench_front_decide(benchmark, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "unset-by-the-app")  # create_app sets it: undone after
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    stream, prefix = _case(case)

    async def run() -> None:
        async with worker(prefix, tmp_path) as w:
            w.core.keep = False
            for _ in range(100):
                await one(w, stream)

            def request() -> None:
                """one(), driven here: its only suspension is sleep(0) (no KV-event matcher,
                so no prepare task to wait for); callbacks it scheduled run below."""
                coro = one(w, stream)
                while True:
                    try:
                        if coro.send(None) is not None:
                            coro.close()
                            raise AssertionError("one() waited for a future")
                    except StopIteration:
                        return

            benchmark(request)
            await asyncio.sleep(0)
            assert not w.core.slow_calls

    asyncio.run(run())
