"""GcMonitor: pauses and collected objects reach the metrics only on flush; thresholds restored.

Deltas, not absolute values: after an in-process app test, prometheus_client may use
multiprocess values, which a new metric of the same name continues from.
"""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from kthena_router.gc_tuning import THRESHOLDS, GcMonitor

PAUSES = "kthena_router_gc_pause_seconds_count"
COLLECTED = "kthena_router_gc_collected_objects_total"


def _value(reg: CollectorRegistry, name: str) -> float:
    v = reg.get_sample_value(name, {"generation": "2"})
    return 0.0 if v is None else v


def test_pauses_and_garbage_are_recorded_on_flush() -> None:
    reg = CollectorRegistry()
    mon = GcMonitor(reg)
    before = gc.get_threshold()
    pauses0, collected0 = _value(reg, PAUSES), _value(reg, COLLECTED)
    mon.start()
    try:
        assert gc.get_threshold() == THRESHOLDS
        for _ in range(50):  # cyclic garbage: only the cyclic GC frees it
            a: list[object] = []
            a.append(a)
        del a
        gc.collect()
        assert _value(reg, PAUSES) == pauses0  # not flushed yet
        mon.flush()
        assert _value(reg, PAUSES) == pauses0 + 1
        assert reg.get_sample_value("kthena_router_gc_pause_seconds_sum", {"generation": "2"}) > 0
        assert _value(reg, COLLECTED) - collected0 >= 50
        mon.flush()  # nothing new
        assert _value(reg, PAUSES) == pauses0 + 1
    finally:
        mon.stop()
    assert gc.get_threshold() == before
    assert mon._callback not in gc.callbacks
    gc.collect()
    mon.flush()
    assert _value(reg, PAUSES) == pauses0 + 1  # no longer listening
