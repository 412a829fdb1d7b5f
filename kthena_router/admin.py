"""Admin HTTP server of the parent process (separate port, default 15000).

GET /healthz            200 while the parent lives
GET /readyz             200 when every worker runs a loaded config (Kubernetes mode: one built
                        after the first full sync) and we are not draining;
                        503 {"ready": false, "reason": ...} otherwise
GET /metrics            Prometheus text aggregated over all workers (multiprocess mode)
POST /admin/reload      validate the config file and the router configuration (--router-config);
                        invalid -> 400 naming file/document/field (old ones stay); valid ->
                        trigger every worker's reload and wait until each reports both digests
GET /debug/config_dump  routes, servers, endpoints of the applied config (no secrets)
GET /debug/<view>       a worker-held debug view (e.g. kv_ownership), relayed from every
                        worker's unix socket ({"workers": [{"pid", ...view}]}) or, with
                        ?pid=N, one worker's view as is (debug_socket.py)

It runs on its own asyncio loop in a thread of the parent, so it stays responsive while
granian's main thread waits for or stops workers.

Must be imported only after PROMETHEUS_MULTIPROC_DIR is set (the supervisor does that):
prometheus_client picks its value storage at import time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
import orjson
import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest, multiprocess
from prometheus_client import CONTENT_TYPE_LATEST

from kthena_router import worker_status
from kthena_router.debug_socket import socket_path
from kthena_router.metrics import KV_USAGE_METRIC
from kthena_router.config.errors import ConfigError
from kthena_router.config.loader import load_config_file
from kthena_router.config.model import RouterConfig
from kthena_router.scheduling.check import validate_router_configuration
from kthena_router.settings import RouterSettings

log = logging.getLogger(__name__)

# Parent-side count of POST /admin/reload outcomes. Workers count the reloads they perform
# themselves (metrics.py, trigger="watch"); trigger="admin" marks these, so one admin call
# is counted once here however many workers there are.
ADMIN_RELOADS = Counter(
    "kthena_router_config_reloads_total",
    "Config reloads by outcome; trigger=admin: POST /admin/reload (counted once by the parent)",
    ["result", "trigger"],
)

class _KnownOnly:
    """The workers' metrics without the KV-usage series they marked unknown (metrics.py:
    a multiprocess series cannot be deleted, so "unknown" is a sentinel value)."""

    def __init__(self, inner: multiprocess.MultiProcessCollector) -> None:
        self.inner = inner

    def collect(self) -> Any:
        for metric in self.inner.collect():
            if metric.name == KV_USAGE_METRIC:
                metric.samples = [s for s in metric.samples if s.value >= 0]
            yield metric


REDACTED = "<redacted>"


class SupervisorView:
    """What the admin server needs from the supervisor (kept small so tests can stub it)."""

    def __init__(
        self,
        settings: RouterSettings,
        worker_pids: Callable[[], list[int]],
    ) -> None:
        self.settings = settings
        self.worker_pids = worker_pids
        self.draining = False
        self.drain_started: float | None = None
        self.kube: Any = None  # Kubernetes mode: the KubeSource (first sync, its digests)

    def begin_drain(self) -> None:
        if not self.draining:
            self.drain_started = time.monotonic()
            self.draining = True


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, default=_json_default, option=orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (tuple, frozenset, set)):
        return list(value)
    raise TypeError(type(value).__name__)


def config_error_body(exc: ConfigError) -> dict[str, Any]:
    return {
        "error": {
            "message": str(exc),
            "type": "invalid_config",
            "file": exc.file,
            "document": exc.document,
            "field": exc.field,
            "problems": [dataclasses.asdict(p) for p in exc.problems],
        }
    }


def config_dump(cfg: RouterConfig) -> dict[str, Any]:
    """Plain-data view of a config; upstream header values (credentials) are redacted."""
    servers = []
    for server in cfg.servers.values():
        data = dataclasses.asdict(server)
        data["upstream_headers"] = {k: REDACTED for k in server.upstream_headers}
        data["endpoints"] = [dataclasses.asdict(ep) for ep in cfg.endpoints_of(server)]
        servers.append(data)
    return {
        "source": cfg.source,
        "digest": cfg.digest,
        "routes": [dataclasses.asdict(r) for r in cfg.routes],
        "servers": servers,
        "endpoint_sets": [dataclasses.asdict(e) for e in cfg.endpoint_sets],
        "warnings": list(cfg.warnings),
    }


class AdminServer:
    def __init__(self, view: SupervisorView, initial_config: RouterConfig) -> None:
        self.view = view
        self.settings = view.settings
        self._config = initial_config  # last config the parent validated
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._reload_lock: asyncio.Lock | None = None

    # --- lifecycle (called from the supervisor's main thread) ----------------------------

    def start(self) -> None:
        """Bind and serve in a daemon thread; raises OSError if the port is taken."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="kthena-admin", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _start_site(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/admin/reload", self.reload)
        app.router.add_get("/debug/config_dump", self.dump)
        app.router.add_get("/debug/workers", self.workers)
        app.router.add_get("/debug/{view}", self.worker_view)
        self._reload_lock = asyncio.Lock()
        # aiohttp's server sets TCP_NODELAY on accepted connections.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.admin_host, self.settings.admin_port, reuse_address=True)
        await site.start()

    # --- helpers ---------------------------------------------------------------------

    def _statuses(self) -> tuple[list[int], dict[int, worker_status.WorkerStatus]]:
        pids = self.view.worker_pids()
        by_pid = {s.pid: s for s in worker_status.read_all(self.settings.runtime_dir)}
        return pids, by_pid

    def readiness(self) -> tuple[bool, str]:
        if self.view.draining:
            return False, "draining"
        kube = self.view.kube
        if kube is not None and not kube.synced.is_set():
            return False, kube.reason_not_synced()
        pids, by_pid = self._statuses()
        if len(pids) < self.settings.workers:
            return False, f"{len(pids)} of {self.settings.workers} workers running"
        missing = [pid for pid in pids if not (pid in by_pid and by_pid[pid].digest)]
        if missing:
            return False, f"workers without a loaded config: {missing}"
        if kube is not None:
            behind = [pid for pid in pids if by_pid[pid].digest == kube.presync_digest]
            if behind:
                return False, f"workers not yet on the first Kubernetes sync: {behind}"
        warming = [f"{pid}: {by_pid[pid].warming}" for pid in pids if by_pid[pid].warming]
        if warming:
            return False, f"workers warming up ({'; '.join(warming)})"
        return True, "ok"

    # --- handlers --------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "draining": self.view.draining})

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.readiness()
        return _json({"ready": ready, "reason": reason}, status=200 if ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        registry.register(_KnownOnly(multiprocess.MultiProcessCollector(None, path=self.settings.prometheus_dir)))
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def workers(self, request: web.Request) -> web.Response:
        pids, by_pid = self._statuses()
        return _json(
            {
                "workers": [
                    msgspec.structs.asdict(by_pid[p]) if p in by_pid else {"pid": p, "digest": ""} for p in pids
                ]
            }
        )

    async def worker_view(self, request: web.Request) -> web.Response:
        view = request.match_info["view"]
        pids = self.view.worker_pids()
        wanted = request.query.get("pid")
        if wanted is not None:
            if not wanted.isdigit() or int(wanted) not in pids:
                return _json(_not_found(f"no worker with pid {wanted!r}"), status=404)
            status, body = await self._ask_worker(int(wanted), view)
            return _json(body, status=status)
        found = []
        for pid in pids:
            status, body = await self._ask_worker(pid, view)
            if status == 200:
                found.append({"pid": pid, **body})
        if not found:
            return _json(_not_found(f"no such debug view: /debug/{view}"), status=404)
        return _json({"workers": found})

    async def _ask_worker(self, pid: int, view: str) -> tuple[int, dict[str, Any]]:
        path = socket_path(self.settings.runtime_dir, pid)
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path),
                                             timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.get(f"http://worker/debug/{view}") as resp:
                    return resp.status, await resp.json()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            return 502, {"error": {"message": f"worker {pid} did not answer ({type(exc).__name__})",
                                   "type": "upstream_error", "param": None, "code": 502}}

    async def reload(self, request: web.Request) -> web.Response:
        assert self._reload_lock is not None
        wait_s = _float_param(request, "timeout", 10.0)
        async with self._reload_lock:  # one reload at a time: digests stay comparable
            loop = asyncio.get_running_loop()
            path = self.settings.config_path
            try:
                cfg = await loop.run_in_executor(None, load_config_file, path)
            except ConfigError as exc:
                ADMIN_RELOADS.labels(result="failure", trigger="admin").inc()
                log.error("config reload rejected, keeping the previous config:\n%s", exc)
                return _json(config_error_body(exc), status=400)
            except OSError as exc:
                ADMIN_RELOADS.labels(result="failure", trigger="admin").inc()
                log.error("config reload failed, keeping the previous config: %s: %s", path, exc)
                body = {"error": {"message": f"{path}: {exc.strerror or exc}", "type": "invalid_config",
                                  "file": path, "document": "", "field": ""}}
                return _json(body, status=400)
            router_digest = ""
            if self.settings.router_config_path:
                try:
                    rc = await loop.run_in_executor(None, validate_router_configuration,
                                                    self.settings.router_config_path)
                except ConfigError as exc:
                    ADMIN_RELOADS.labels(result="failure", trigger="admin").inc()
                    log.error("router configuration reload rejected, keeping the previous one:\n%s", exc)
                    return _json(config_error_body(exc), status=400)
                router_digest = rc.digest
            self._config = cfg
            await loop.run_in_executor(None, _touch_trigger, self.settings.reload_trigger_path, cfg.digest)
            applied, pending = await self._wait_applied(cfg.digest, router_digest, wait_s)
            ok = not pending
            ADMIN_RELOADS.labels(result="success" if ok else "timeout", trigger="admin").inc()
            body = {"digest": cfg.digest, "router_config_digest": router_digest, "applied": ok,
                    "workers": applied, "pending": pending}
            if not ok:
                log.warning("config %s validated but workers %s did not apply it within %.1fs",
                            cfg.digest[:12], pending, wait_s)
            return _json(body, status=200 if ok else 504)

    async def _wait_applied(self, digest: str, router_digest: str,
                            wait_s: float) -> tuple[list[int], list[dict[str, Any]]]:
        deadline = time.monotonic() + wait_s
        while True:
            pids, by_pid = self._statuses()
            applied = [p for p in pids if p in by_pid and by_pid[p].digest == digest
                       and by_pid[p].router_digest == router_digest]
            pending = [
                {"pid": p, "digest": by_pid[p].digest if p in by_pid else "",
                 "router_config_digest": by_pid[p].router_digest if p in by_pid else "",
                 "last_error": by_pid[p].last_error if p in by_pid else None}
                for p in pids if p not in applied
            ]
            if (pids and not pending) or time.monotonic() >= deadline:
                return applied, pending
            await asyncio.sleep(0.05)

    async def dump(self, request: web.Request) -> web.Response:
        pids, by_pid = self._statuses()
        digests = {by_pid[p].digest for p in pids if p in by_pid}
        if digests and digests != {self._config.digest}:
            # A file-watch reload happened in the workers: catch up if the file matches.
            try:
                cfg = await asyncio.get_running_loop().run_in_executor(
                    None, load_config_file, self.settings.config_path
                )
                if cfg.digest in digests:
                    self._config = cfg
            except (ConfigError, OSError):
                pass
        body = config_dump(self._config)
        body["workers"] = [
            {"pid": p, "digest": by_pid[p].digest if p in by_pid else "",
             "last_error": by_pid[p].last_error if p in by_pid else None}
            for p in pids
        ]
        return _json(body)


def _not_found(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "NotFoundError", "param": None, "code": 404}}


def _float_param(request: web.Request, name: str, default: float) -> float:
    try:
        return max(0.0, min(float(request.query.get(name, default)), 120.0))
    except ValueError:
        return default


def _touch_trigger(path: str, digest: str) -> None:
    """Rewrite the trigger file in place (same inode: seen by file and directory watches)."""
    with open(path, "w") as fh:
        fh.write(f"{digest} {time.time()}\n")
