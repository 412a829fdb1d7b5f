"""Per-worker status files: how the parent's admin server learns what each worker runs.

A worker writes `<runtime_dir>/worker-<pid>.json` after every config (re)load attempt:
the digest of the config it applies now, when, and the last reload error (if any).
Writes are atomic (temp file + rename), so readers never see half a file.
The parent reads them for /readyz (every worker up with a config) and for
POST /admin/reload (wait until every worker applied the new digest).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from kthena_router.settings import RouterSettings

_PREFIX = "worker-"
_SUFFIX = ".json"


class WorkerStatus(msgspec.Struct, kw_only=True):
    pid: int
    digest: str
    """Digest of the config the worker serves now ("" if none loaded yet)."""
    router_digest: str = ""
    """Digest of the router configuration (--router-config) in use ("" without one)."""
    applied_at: float
    """Unix time of the last successful apply."""
    started_at: float = 0.0
    last_error: str | None = None
    """Message of the last failed reload (the old config stays in use), None if it succeeded."""
    updated_at: float = 0.0
    pod_state: str = ""
    """"hub": engine state from the pod-state hub; "local": this worker scrapes and probes
    itself (hub down); "": no hub (one worker, or --pod-state off)."""
    warming: str = ""
    """What the worker still waits for before it takes traffic (first scrapes, KV-event
    streams; bounded, warmup.py), "" once warm. /readyz fails while any worker warms up."""


def _path(runtime_dir: str, pid: int) -> Path:
    return Path(runtime_dir) / f"{_PREFIX}{pid}{_SUFFIX}"


def _write(runtime_dir: str, status: WorkerStatus) -> None:
    target = _path(runtime_dir, status.pid)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(msgspec.json.encode(status))
    os.replace(tmp, target)


def _read_one(path: Path) -> WorkerStatus | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=WorkerStatus)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


_started_at = 0.0  # set on the first report of this process
# fields every report of this process carries (a report rewrites the whole file)
_carried: dict[str, str] = {"router_digest": "", "pod_state": "", "warming": ""}


def report_applied(settings: "RouterSettings", digest: str) -> None:
    """Worker side: the config with `digest` is now in use (initial load or reload)."""
    global _started_at
    if not settings.runtime_dir:
        return  # not started by the supervisor (e.g. a unit test building the app)
    now = time.time()
    _started_at = _started_at or now
    _write(
        settings.runtime_dir,
        WorkerStatus(pid=os.getpid(), digest=digest, applied_at=now, started_at=_started_at,
                     updated_at=now, **_carried),
    )


def _carry(settings: "RouterSettings", clear_error: bool = False, **fields: str) -> None:
    """Remember `fields` for every later report and rewrite the current one with them."""
    _carried.update(fields)
    if not settings.runtime_dir:
        return
    previous = _read_one(_path(settings.runtime_dir, os.getpid()))
    if previous is None:
        return  # the first report_applied carries them
    status = msgspec.structs.replace(previous, updated_at=time.time(), **fields)
    _write(settings.runtime_dir, msgspec.structs.replace(status, last_error=None) if clear_error else status)


def report_router_config_applied(settings: "RouterSettings", digest: str) -> None:
    """Worker side: the router configuration with `digest` is now in use."""
    _carry(settings, clear_error=True, router_digest=digest)


def report_pod_state(settings: "RouterSettings", mode: str) -> None:
    """Worker side: where its engine state comes from now ("hub" or "local")."""
    _carry(settings, pod_state=mode)


def report_warming(settings: "RouterSettings", reason: str) -> None:
    """Worker side: what it still waits for before it is ready (warmup.py); "" when done."""
    _carry(settings, warming=reason)


def report_failed(settings: "RouterSettings", error: str) -> None:
    """Worker side: a reload failed; the previously applied digest stays in use."""
    if not settings.runtime_dir:
        return
    previous = _read_one(_path(settings.runtime_dir, os.getpid()))
    now = time.time()
    status = previous or WorkerStatus(pid=os.getpid(), digest="", applied_at=0.0, **_carried)
    _write(settings.runtime_dir, msgspec.structs.replace(status, last_error=error, updated_at=now))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_all(runtime_dir: str, *, alive_only: bool = True) -> list[WorkerStatus]:
    """Parent side: status of every worker (of live processes only, by default), by pid."""
    out: list[WorkerStatus] = []
    for path in Path(runtime_dir).glob(f"{_PREFIX}*{_SUFFIX}"):
        status = _read_one(path)
        if status is None:
            continue
        if alive_only and not _pid_alive(status.pid):
            continue
        out.append(status)
    return sorted(out, key=lambda s: s.pid)


def remove(runtime_dir: str, pid: int) -> None:
    """Parent side: forget a dead worker."""
    try:
        _path(runtime_dir, pid).unlink()
    except FileNotFoundError:
        pass


def dead_pids(runtime_dir: str) -> list[int]:
    """Parent side: pids with a status file whose process is gone."""
    return [s.pid for s in read_all(runtime_dir, alive_only=False) if not _pid_alive(s.pid)]
