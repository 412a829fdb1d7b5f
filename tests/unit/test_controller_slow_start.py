"""The reconciler's slow-start batches: concurrency 1, 2, 4, ... up to the limit; the first
error stops further batches after its own batch finished."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.reconciler import slow_start


def run(n: int, fail_at: int | None = None, limit: int = 8) -> tuple[list[int], list[int], BaseException | None]:
    batches: list[int] = []
    done: list[int] = []
    in_flight = 0

    async def call(obj: Any) -> None:
        nonlocal in_flight
        in_flight += 1
        if in_flight == 1:
            batches.append(0)
        batches[-1] = max(batches[-1], in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        if obj["i"] == fail_at:
            raise RuntimeError(f"boom {obj['i']}")
        done.append(obj["i"])

    async def main() -> BaseException | None:
        try:
            await slow_start([{"i": i} for i in range(n)], call, limit)
        except RuntimeError as exc:
            return exc
        return None

    err = asyncio.run(main())
    return batches, done, err


def test_batches_double_up_to_the_limit() -> None:
    batches, done, err = run(40)
    assert err is None and sorted(done) == list(range(40))
    assert batches == [1, 2, 4, 8, 8, 8, 8, 1]


@pytest.mark.parametrize("fail_at, finished", [(0, 0), (2, 3 - 1), (5, 7 - 1)])
def test_an_error_ends_after_its_batch(fail_at: int, finished: int) -> None:
    _, done, err = run(40, fail_at)
    assert isinstance(err, RuntimeError) and str(err) == f"boom {fail_at}"
    assert len(done) == finished and fail_at not in done and max(done, default=-1) < 8
