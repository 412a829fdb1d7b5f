"""The supervisor's handle on the pod-state hub process: start, restart when it died,
stop. The hub's pid is in `<runtime_dir>/pod-state-hub.pid` (tests, operators)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import uuid
from pathlib import Path
from typing import Any

import msgspec

from kthena_router.settings import RouterSettings

log = logging.getLogger(__name__)

SOCKET_NAME = "pod-state.sock"
PID_NAME = "pod-state-hub.pid"


def with_hub_socket(settings: RouterSettings) -> RouterSettings:
    """Settings naming the hub's socket when this router runs a hub (several workers and
    --pod-state auto); unchanged otherwise: one worker keeps everything in-process."""
    if settings.workers < 2 or settings.pod_state != "auto" or not settings.runtime_dir:
        return settings
    return msgspec.structs.replace(settings, pod_state_socket=settings.socket_in_runtime_dir(SOCKET_NAME),
                                   pod_id=settings.pod_id or uuid.uuid4().hex[:16])


class HubProcess:
    def __init__(self, settings: RouterSettings, log_config: dict[str, Any]) -> None:
        self.settings = settings
        self.log_config = log_config
        self.proc: Any = None
        self.starts = 0
        self.metrics: Any = None  # HubRestarts, created at the first start (file-backed by then)
        self._stopped = False

    def start(self) -> None:
        from . import hub

        if self.metrics is None:
            from .hub_metrics import HubRestarts

            self.metrics = HubRestarts()
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(target=hub.main, name="kthena-pod-state-hub", daemon=True,
                                args=(self.settings.to_json(), self.settings.pod_state_socket, self.log_config))
        self.proc.start()
        self.starts += 1
        try:  # atomically: a reader never sees an empty file
            target = Path(self.settings.runtime_dir) / PID_NAME
            tmp = target.with_name(f".{PID_NAME}.tmp")
            tmp.write_text(str(self.proc.pid))
            os.replace(tmp, target)
        except OSError:
            pass

    def no_restart(self) -> None:
        """Draining: a hub that dies now stays dead (the workers poll on their own)."""
        self._stopped = True

    def ensure(self) -> None:
        """Restart a hub that died (the workers work on their own meanwhile)."""
        if self._stopped or self.proc is None or self.proc.is_alive():
            return
        log.warning("pod-state hub (pid %s) exited with %s; restarting it", self.proc.pid, self.proc.exitcode)
        if self.settings.prometheus_dir:  # its live gauges go; its counters stay summed
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(self.proc.pid, self.settings.prometheus_dir)
        if self.metrics is not None:
            self.metrics.restarts.inc()
        self.start()

    def stop(self) -> None:
        self._stopped = True
        if self.proc is not None and self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        sock = Path(self.settings.pod_state_socket)
        sock.unlink(missing_ok=True)
        if sock.parent.name.startswith("ktr-"):
            try:
                sock.parent.rmdir()
            except OSError:
                pass
