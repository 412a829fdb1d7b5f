"""The router's parent process: runtime dir, admin server, granian workers, SIGTERM drain.

Shutdown, as measured with granian 2.8.9 (see docs/architecture.md "Router settings and
processes"): on SIGTERM/SIGINT granian's parent closes its socket and sends SIGTERM to
every worker; a worker stops accepting at once (new connections are refused), lets
in-flight requests and streams run to their end, closes idle keep-alive connections,
runs the ASGI lifespan shutdown and exits. Granian kills a worker still alive after
`workers_kill_timeout`. So we only add: /readyz fails at the signal (our handler runs
before granian's), and the kill timeout is the drain grace period. A second signal
during the drain kills the workers at once. The handlers themselves only queue the
signal (stop_signals.py says why).

TCP_NODELAY: granian sets it on the listening socket; Linux copies it to every accepted
socket (checked with getsockopt on the accepted sockets, see tests/integration/
test_lifecycle_sockets.py), so no extra step is needed.
"""

from __future__ import annotations

import errno
import logging
import math
import multiprocessing
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from kthena_router import worker_status
from kthena_router.config.model import RouterConfig
from kthena_router.front.choice import resolve_interface
from kthena_router.settings import FRONT_SOCKET_NAME, PROMETHEUS_SUBDIR, SHORT_SOCKET_DIR_PREFIX, RouterSettings
from kthena_router.stop_signals import StopSignals

log = logging.getLogger(__name__)

class PortInUseError(OSError):
    pass


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail clearly if host:port is taken.

    Granian binds with SO_REUSEPORT, so a second router on the same port would silently
    share it with the first: a plain bind (no SO_REUSEPORT) catches that.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(exc.errno, f"{what} {host}:{port} is already in use") from exc
            raise OSError(exc.errno, f"cannot bind {what} {host}:{port}: {exc.strerror}") from exc


def prepare_runtime_dir(settings: RouterSettings) -> tuple[RouterSettings, bool]:
    """Create (or clean) the runtime dir; returns resolved settings and whether we created it."""
    created = not settings.runtime_dir
    runtime = Path(settings.runtime_dir or tempfile.mkdtemp(prefix="kthena-router-"))
    runtime.mkdir(parents=True, exist_ok=True)
    prom = runtime / PROMETHEUS_SUBDIR
    # Stale files of an earlier run would add old counts to ours.
    if prom.exists():
        shutil.rmtree(prom)
    prom.mkdir()
    for stale in runtime.glob("worker-*.json"):
        stale.unlink(missing_ok=True)
    resolved = RouterSettings(**{**_struct_dict(settings), "runtime_dir": str(runtime)}).resolved()
    Path(resolved.reload_trigger_path).touch()
    Path(resolved.drain_marker_path).unlink(missing_ok=True)
    return resolved, created


def _struct_dict(settings: RouterSettings) -> dict[str, Any]:
    return {f: getattr(settings, f) for f in settings.__struct_fields__}


def logging_config(level: str) -> dict[str, Any]:
    """dictConfig for parent and workers: everything to stderr, one format."""
    lvl = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"generic": {"format": "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "generic", "stream": "ext://sys.stderr"},
        },
        "loggers": {
            "_granian": {"handlers": ["console"], "level": lvl, "propagate": False},
            "granian.access": {"handlers": ["console"], "level": "WARNING", "propagate": False},
            # watchfiles logs every batch of file events at INFO.
            "watchfiles": {"level": "WARNING"},
        },
        "root": {"handlers": ["console"], "level": lvl},
    }


class Supervisor:
    """Runs the router until SIGTERM/SIGINT; `run()` returns the process exit code."""

    def __init__(self, settings: RouterSettings, initial_config: RouterConfig | None,
                 on_view: Sequence[Any] = ()) -> None:
        """`initial_config`: the validated config file (None in Kubernetes mode, where the
        watch renders it); `on_view`: Kubernetes mode's ClusterView hooks (kube/source.py)."""
        self.settings = settings
        self.initial_config = initial_config
        self.on_view = on_view
        self.kube: Any = None  # KubeSource in Kubernetes mode
        self._server: Any = None
        self._known_pids: set[int] = set()
        self._stop = threading.Event()
        self.hub: Any = None  # HubProcess with several workers (podstate/process.py)

    # --- workers ---------------------------------------------------------------------

    def worker_pids(self) -> list[int]:
        server = self._server
        if server is None:
            return []
        pids = []
        for wrk in list(getattr(server, "wrks", [])):
            try:
                if wrk.is_alive() and wrk.inner.pid:
                    pids.append(wrk.inner.pid)
            except (AttributeError, ValueError):
                continue
        return pids

    def _reap_loop(self) -> None:
        """Forget dead workers: their live gauges and status files (counters stay summed)."""
        from prometheus_client import multiprocess

        while not self._stop.wait(0.5):
            self._reap_once(multiprocess)
            if self.hub is not None:
                self.hub.ensure()
        self._reap_once(multiprocess)

    def _reap_once(self, multiprocess: Any) -> None:
        alive = set(self.worker_pids())
        for pid in list(self._known_pids - alive) + worker_status.dead_pids(self.settings.runtime_dir):
            if pid in alive:
                continue
            multiprocess.mark_process_dead(pid, self.settings.prometheus_dir)
            worker_status.remove(self.settings.runtime_dir, pid)
            self._known_pids.discard(pid)
        self._known_pids |= alive

    # --- main --------------------------------------------------------------------------

    def run(self) -> int:
        from kthena_router.podstate.process import HubProcess, with_hub_socket

        settings = self.settings = _with_front_socket(with_hub_socket(self.settings))
        # Before anything imports prometheus_client: it picks file-backed values at import.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = settings.prometheus_dir
        # The startup check of --router-config may have imported prometheus_client already (in
        # single-process mode): the parent's metrics (admin reloads, Kubernetes watch and status)
        # would then stay in memory, never reaching /metrics. Metrics created from here on are
        # file-backed; those created before are workers' metrics the parent never uses.
        import prometheus_client.values as prom_values

        prom_values.ValueClass = prom_values.get_value_class()
        os.environ.update(settings.to_env())
        # Fresh interpreters for workers: no inherited admin thread, locks or metric state.
        multiprocessing.set_start_method("spawn", force=True)

        from granian.constants import HTTPModes, Interfaces, Loops
        from granian.log import LogLevels
        from granian.server import Server

        from kthena_router.admin import AdminServer, SupervisorView

        view = SupervisorView(settings, self.worker_pids)
        initial = self.initial_config
        if settings.kubernetes:
            # One watch set per router, here in the parent; the workers load the rendered file.
            from kthena_router.config.loader import load_config_file
            from kthena_router.kube.source import KubeSource

            self.kube = view.kube = KubeSource(settings, self.on_view)
            self.kube.write_initial()
            initial = load_config_file(settings.config_path)
        assert initial is not None
        admin = AdminServer(view, initial)
        admin.start()
        if self.kube is not None:
            self.kube.start()
        log.info("admin server on http://%s:%d", settings.admin_host, settings.admin_port)
        if settings.pod_state_socket:  # before the workers: they connect at start
            self.hub = HubProcess(settings, logging_config(settings.log_level))
            self.hub.start()

        server: Any = None

        def begin_drain() -> None:
            view.begin_drain()
            self._write_drain_marker()
            if self.hub is not None:
                self.hub.no_restart()
            log.warning("stop signal: draining (readyz fails, in-flight requests get %.0fs)",
                        settings.drain_grace_s)

        def kill_workers() -> None:
            log.warning("second stop signal: killing workers now")
            for wrk in list(server.wrks):
                try:
                    wrk.kill()
                except Exception:  # already gone
                    pass

        signals = StopSignals(
            on_first=begin_drain, on_second=kill_workers,
            wake_for_stop=lambda: Server.signal_handler_interrupt(server),
            wake_for_reload=lambda: Server.signal_handler_reload(server),
            worker_pids=self.worker_pids,
        )

        class RouterServer(Server):  # type: ignore[misc, valid-type]
            # granian installs these two with signal.signal in its main thread.
            signal_handler_interrupt = staticmethod(signals.handler)
            signal_handler_reload = staticmethod(signals.reload_handler)

        bind: dict[str, Any] = {"address": settings.host, "port": settings.port}
        if settings.interface == "rust":  # the workers' Rust front ends bind host:port (docs/rust-front.md)
            uds = Path(settings.front_socket_path)
            uds.unlink(missing_ok=True)
            bind = {"uds": uds}
        server = RouterServer(
            settings.app_factory,
            **bind,
            interface=Interfaces.ASGI if settings.interface == "asgi" else Interfaces.RSGI,
            workers=settings.workers,
            loop=Loops.uvloop,
            http=HTTPModes.http1,
            factory=True,
            log_enabled=True,
            log_level=LogLevels(settings.log_level.lower()),
            log_dictconfig=logging_config(settings.log_level),
            log_access=False,
            respawn_failed_workers=True,
            # granian takes whole seconds; the drain ends when the last request ends.
            workers_kill_timeout=max(1, math.ceil(settings.drain_grace_s)),
            backlog=2048,
            websockets=False,
            process_name=_process_name(settings),
        )
        self._server = server
        signals.start()
        reaper = threading.Thread(target=self._reap_loop, name="kthena-reaper", daemon=True)
        reaper.start()
        code = 0
        try:
            server.serve()
        except SystemExit as exc:  # granian exits 1 when workers crashed for good
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            self._stop.set()
            signals.close()
            if self.kube is not None:
                self.kube.stop()
            reaper.join(timeout=5)
            if self.hub is not None:
                self.hub.stop()
            admin.stop()
        if code:
            log.error("router stopped: workers failed (see the log above)")
        return code

    def _write_drain_marker(self) -> None:
        try:
            Path(self.settings.drain_marker_path).touch()
        except OSError:
            pass


def _with_front_socket(settings: RouterSettings) -> RouterSettings:
    """--interface rust: granian's socket, in a short private dir if the runtime dir is deep."""
    if settings.interface != "rust" or not settings.runtime_dir:
        return settings
    path = settings.socket_in_runtime_dir(FRONT_SOCKET_NAME)
    return settings if path == settings.front_socket_path else msgspec.structs.replace(settings, front_socket=path)


def _process_name(settings: RouterSettings) -> str | None:
    """`ps` shows "kthena-router HOST:PORT" (granian needs setproctitle for it)."""
    try:
        import setproctitle  # noqa: F401
    except ImportError:
        return None
    return f"kthena-router {settings.host}:{settings.port}"


def run(settings: RouterSettings, initial_config: RouterConfig | None, on_view: Sequence[Any] = ()) -> int:
    """Prepare the runtime dir, run the router, clean up; returns the exit code."""
    settings = resolve_interface(settings)
    check_port_free(settings.host, settings.port, "listen address")
    check_port_free(settings.admin_host, settings.admin_port, "admin address")
    resolved, created = prepare_runtime_dir(settings)
    sup = Supervisor(resolved, initial_config, on_view)
    try:
        return sup.run()
    finally:
        for sock in (sup.settings.front_socket, sup.settings.pod_state_socket):
            if sock and Path(sock).parent.name.startswith(SHORT_SOCKET_DIR_PREFIX):  # made for it at start
                shutil.rmtree(Path(sock).parent, ignore_errors=True)
        if created:
            shutil.rmtree(resolved.runtime_dir, ignore_errors=True)
