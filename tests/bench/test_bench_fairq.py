"""Fair queue decisions in the Rust core: enqueue + dequeue with 10,000 waiting requests
from 1,000 tenants (issue 9: at most 2 us per pair, measured from Python; the figure
is reported, not asserted: no wall-clock assertions in tests)."""

from kthena_router._core import FairQueue

WAITING = 10_000
TENANTS = 1_000


def test_bench_fairq_enqueue_dequeue(benchmark):
    q = FairQueue([(0, 1.0, 1 << 20), (1, 1.0, 1 << 20)])
    for i in range(WAITING):
        assert q.enqueue(i % 2, i % TENANTS, 1.0 + (i % 3), 100, 0)
    state = {"i": 0}

    def pair() -> int:
        i = state["i"] = state["i"] + 1
        q.enqueue(i & 1, (i * 7919) % TENANTS, 1.0, 100, i)
        return q.dequeue(i)

    ticket = benchmark(pair)
    assert ticket > 0
    assert len(q) == WAITING  # one in, one out: the queue stayed at 10,000
    assert q.tenants() == TENANTS
