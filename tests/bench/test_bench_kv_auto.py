"""What automatic exact matching (scheduling/exact_auto.py) costs a prefix-cache +
least-request decision. One run, one group, so the variants compare within it (setups:
loadtest/kv_auto_overhead.py, which also times the first two in alternating blocks):

- `no-matcher`: kvEvents off (or no tokenizers): the default path before this change;
- `auto-no-streams`: the automatic matcher built (tokenizers given), no endpoint
  advertising a KV-event port: the case that must cost nothing;
- `auto-streams`: every endpoint advertises one (streams not up: the matcher tokenizes
  and matches anyway): the price of exact matching itself, for reference.

Each call is a whole Scheduler.candidates over 8 endpoints for a new request (a ~3 KB
chat prompt extending a cached system prompt). Run with --benchmark-only (`make bench`)."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.kv_auto_overhead import VARIANTS, decider


@pytest.mark.benchmark(group="kv-auto-decision")
@pytest.mark.parametrize("variant", VARIANTS)
def test_bench_prefix_cache_decision(benchmark: Any, variant: str) -> None:
    benchmark(decider(variant))
