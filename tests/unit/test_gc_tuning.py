"""GcMonitor: pauses and collected objects reach the metrics only on flush; thresholds restored."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from kthena_router.gc_tuning import THRESHOLDS, GcMonitor


def _value(reg: CollectorRegistry, name: str, gen: str) -> float:
    v = reg.get_sample_value(name, {"generation": gen})
    return 0.0 if v is None else v


def test_pauses_and_garbage_are_recorded_on_flush() -> None:
    reg = CollectorRegistry()
    mon = GcMonitor(reg)
    before = gc.get_threshold()
    mon.start()
    try:
        assert gc.get_threshold() == THRESHOLDS
        for _ in range(50):  # cyclic garbage: only the cyclic GC frees it
            a: list[object] = []
            a.append(a)
        del a
        gc.collect()
        assert _value(reg, "kthena_router_gc_pause_seconds_count", "2") == 0  # not flushed yet
        mon.flush()
        assert _value(reg, "kthena_router_gc_pause_seconds_count", "2") == 1
        assert _value(reg, "kthena_router_gc_pause_seconds_sum", "2") > 0
        assert _value(reg, "kthena_router_gc_collected_objects_total", "2") >= 50
        mon.flush()  # nothing new
        assert _value(reg, "kthena_router_gc_pause_seconds_count", "2") == 1
    finally:
        mon.stop()
    assert gc.get_threshold() == before
    assert mon._callback not in gc.callbacks
    gc.collect()
    mon.flush()
    assert _value(reg, "kthena_router_gc_pause_seconds_count", "2") == 1  # no longer listening
