"""The parent's stop signals: queued by the handler, acted on by a thread."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

from kthena_router.stop_signals import StopSignals

# Ignores the first SIGTERM (a worker that missed it while starting), exits on the next.
MISSES_FIRST = """
import signal, sys, time
seen = []
def on_term(*_):
    seen.append(1)
    if len(seen) > 1:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _signals(calls: list[str], pids: list[int]) -> StopSignals:
    return StopSignals(
        on_first=lambda: calls.append("first"), on_second=lambda: calls.append("second"),
        wake_for_stop=lambda: calls.append("wake"), wake_for_reload=lambda: calls.append("reload"),
        worker_pids=lambda: list(pids), resend_every_s=0.05,
    )


def test_first_signal_drains_second_kills_and_reload_only_before_a_stop() -> None:
    calls: list[str] = []
    s = _signals(calls, [])
    s.start()
    s.reload_handler(signal.SIGHUP)
    s.handler(signal.SIGTERM)
    s.reload_handler(signal.SIGHUP)  # no respawn during a drain
    s.handler(signal.SIGINT)
    s.close()
    assert calls == ["reload", "first", "wake", "second", "wake"]


def test_a_worker_that_missed_the_stop_signal_gets_it_again() -> None:
    child = subprocess.Popen([sys.executable, "-c", MISSES_FIRST], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)  # granian's own SIGTERM, missed
        calls: list[str] = []
        s = _signals(calls, [child.pid])
        s.start()
        s.handler(signal.SIGTERM)
        assert child.wait(timeout=60) == 0
        s.close()
        assert calls == ["first", "wake"]
    finally:
        child.kill()
        child.wait()


def test_the_handler_only_queues() -> None:
    """Called while its own thread is blocked in a callback, the handler returns at once."""
    release = threading.Event()
    entered = threading.Event()
    calls: list[str] = []

    def blocked_first() -> None:
        entered.set()
        release.wait(60)
        calls.append("first")

    s = StopSignals(on_first=blocked_first, on_second=lambda: calls.append("second"),
                    wake_for_stop=lambda: None, wake_for_reload=lambda: None, worker_pids=list)
    s.start()
    s.handler(signal.SIGTERM)
    assert entered.wait(60)
    s.handler(signal.SIGINT)  # returns although the thread is busy
    assert calls == []
    release.set()
    s.close()
    assert calls == ["first", "second"]
