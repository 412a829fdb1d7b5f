"""`maxInFlightPerEndpoint: auto`: the per-endpoint batch capacity learned from scrapes."""

from __future__ import annotations

from kthena_router.fairness.capacity import CapacityLearner


def test_a_passing_queue_at_low_load_does_not_cap_the_engine_for_good() -> None:
    """A scrape at low load that caught one request between steps teaches a capacity far
    below the engine's; when the engine then runs more with nothing queued, the capacity
    doubles from what it ran, so the limit (capacity + 1) never pins the engine where it was."""
    c = CapacityLearner()
    c.observe("e", running=15, waiting=1)  # a passing queue
    assert c.get("e") == 15
    c.observe("e", running=12, waiting=0)
    assert c.get("e") == 15  # running below capacity: nothing learned
    c.observe("e", running=16, waiting=0)  # the router's headroom went through: it can take more
    assert c.get("e") == 32
    c.observe("e", running=33, waiting=0)
    assert c.get("e") == 66
    c.observe("e", running=60, waiting=1)  # one waiting request below capacity: a passing queue again
    assert c.get("e") == 66


def test_a_persistent_queue_sets_the_capacity_and_later_growth_is_an_eighth() -> None:
    c = CapacityLearner()
    c.observe("e", running=40, waiting=0)
    assert c.get("e") is None  # never queued: no limit
    c.observe("e", running=100, waiting=3)
    c.observe("e", running=96, waiting=5)  # queues on two scrapes in a row: the engine is full at 96
    assert c.get("e") == 96 and "e" in c.settled
    c.observe("e", running=97, waiting=0)  # settled: grow by an eighth, not double
    assert c.get("e") == 97 + 12
    c.observe("e", running=80, waiting=2)
    c.observe("e", running=80, waiting=2)  # heavier requests: the capacity follows it down
    assert c.get("e") == 80


def test_an_engine_at_its_batch_limit_keeps_its_capacity() -> None:
    """--max-num-seqs 2 with the router holding one more: the engine always runs 2 and
    queues 1 or 0; the capacity stays 2 (the limit 3 that the integration test checks)."""
    c = CapacityLearner()
    for waiting in (1, 1, 0, 1, 0, 0, 1, 1):
        c.observe("e", running=2, waiting=waiting)
        assert c.get("e") == 2


def test_stale_scrapes_break_the_run_and_forget_drops_endpoints() -> None:
    c = CapacityLearner()
    c.observe("a", running=10, waiting=2)
    c.observe("a", running=None, waiting=None)  # stale: not two scrapes in a row
    c.observe("a", running=5, waiting=2)
    assert c.get("a") == 10 and "a" not in c.settled
    c.observe("a", running=0, waiting=4)  # nothing running (loading, or a fresh start): no evidence
    assert c.get("a") == 10
    c.observe("b", running=3, waiting=1)
    c.forget({"b"})
    assert c.get("a") is None and c.get("b") == 3
