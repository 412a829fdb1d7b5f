"""The parent's signal handling, done off the signal handler.

Python runs a signal handler in the main thread between two bytecodes of whatever it was
doing, and granian's main thread spends its life inside `threading.Event.wait()`. A handler
that takes a lock the interrupted code holds (that Event's own condition lock, taken on the way
into and out of the wait; a logging lock) waits for itself forever: the process then neither
drains nor dies. So the handler only puts the signal on a `queue.SimpleQueue`, whose `put` is
reentrant by design, and a thread does the work: start the drain, wake granian's main loop,
and on a second signal kill the workers.

During the drain the thread also repeats SIGTERM to the workers still alive: a worker that
receives granian's SIGTERM while it is still starting can miss it and then keeps its
listener open for the whole grace period. A repeated SIGTERM is harmless to a draining
worker: it only sets the stop event it already set (in-flight streams still finish,
tests/integration/test_lifecycle_drain.py).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

RELOAD = -1  # SIGHUP: granian's graceful worker respawn
_STOP_THREAD = -2


class StopSignals:
    """`handler` goes to signal.signal; `start()` runs the thread that acts on it."""

    def __init__(self, *, on_first: Callable[[], None], on_second: Callable[[], None],
                 wake_for_stop: Callable[[], None], wake_for_reload: Callable[[], None],
                 worker_pids: Callable[[], list[int]], resend_every_s: float = 1.0) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._on_first = on_first
        self._on_second = on_second
        self._wake_for_stop = wake_for_stop
        self._wake_for_reload = wake_for_reload
        self._worker_pids = worker_pids
        self._resend_every_s = resend_every_s
        self._thread = threading.Thread(target=self._run, name="kthena-stop-signals", daemon=True)
        self.stopping = False

    def handler(self, signum: int, frame: object = None) -> None:
        self._queue.put(signum)

    def reload_handler(self, signum: int, frame: object = None) -> None:
        self._queue.put(RELOAD)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._queue.put(_STOP_THREAD)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            sig = self._queue.get() if not self.stopping else self._get_or_resend()
            if sig == _STOP_THREAD:
                return
            if sig is None:
                continue
            if sig == RELOAD:
                if not self.stopping:
                    self._wake_for_reload()
            elif not self.stopping:
                self.stopping = True
                self._on_first()
                self._wake_for_stop()
            else:
                self._on_second()
                self._wake_for_stop()

    def _get_or_resend(self) -> int | None:
        try:
            return self._queue.get(timeout=self._resend_every_s)
        except queue.Empty:
            for pid in self._worker_pids():
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:  # gone meanwhile
                    pass
            return None
