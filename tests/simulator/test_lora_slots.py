"""LoRA GPU slots: LRU over max_loras adapters, a load cost per slot load, and the CLI split
between registered adapters (--max-cpu-loras) and adapters per batch (--max-loras)."""

from __future__ import annotations

import subprocess
import sys

from loadtest.simulator.clock import VirtualClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest


def _run_until_done(e: Engine) -> list[float]:
    """Run the scheduler by hand; -> the duration of every step."""
    sched, durations = e.scheduler, []
    while sched.has_work():
        plan = sched.schedule()
        durations.append(plan.duration)
        sched.commit(plan, 0.0)
    return durations


def test_loading_an_adapter_costs_its_load_time_once_while_it_stays_in_a_slot() -> None:
    base = Engine(EngineConfig(max_loras=2), VirtualClock())
    base.submit(GenRequest("x", [1] * 8, 1, lora="A"))
    (plain,) = _run_until_done(base)
    e = Engine(EngineConfig(max_loras=2, lora_load_s=0.5), VirtualClock())
    e.submit(GenRequest("a", [1] * 8, 1, lora="A"))
    (first,) = _run_until_done(e)
    assert first == plain + 0.5
    e.submit(GenRequest("a2", [2] * 8, 1, lora="A"))  # still in its slot: no load
    (again,) = _run_until_done(e)
    assert again < first
    assert e.snapshot().lora_loads_total == 1


def test_a_third_adapter_evicts_the_least_recently_used_slot() -> None:
    e = Engine(EngineConfig(max_loras=2, lora_load_s=0.1), VirtualClock())
    for rid, lora in (("a", "A"), ("b", "B"), ("a2", "A"), ("c", "C"), ("a3", "A"), ("b2", "B")):
        e.submit(GenRequest(rid, [len(rid)] * 8, 1, lora=lora))
        _run_until_done(e)
    # A, B loaded; C evicts B (A used more recently); A stays; B reloads (evicting C)
    assert e.snapshot().lora_loads_total == 4
    assert list(e.scheduler.lora_slots) == ["A", "B"]


def test_cli_registers_more_adapters_than_batch_slots() -> None:
    args = [sys.executable, "-m", "loadtest.simulator", "--help"]
    assert "--max-cpu-loras" in subprocess.run(args, capture_output=True, text=True).stdout
    bad = [sys.executable, "-m", "loadtest.simulator", "--max-loras", "4",
           "--lora", "a", "b", "c", "d", "e"]
    res = subprocess.run(bad, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "exceed --max-loras 4" in res.stderr
    res = subprocess.run(bad + ["--max-cpu-loras", "4"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "exceed --max-cpu-loras 4" in res.stderr
    worse = bad[:3] + ["--max-loras", "4", "--max-cpu-loras", "2"]
    res = subprocess.run(worse, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and ">= --max-loras" in res.stderr
