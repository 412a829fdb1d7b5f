"""KubeSource: the supervisor's watch of the cluster, rendered into the workers' config file.

One watch set per router (not per worker): the supervisor process lists and watches
ModelRoute, ModelServer, ExternalModelProvider, the labelled credential Secrets and the
Pods (one namespace, or the whole cluster), builds the config (assemble.py) and writes it
as YAML into `<runtime_dir>/kubernetes-config.yaml`. The workers run file mode on that file:
their ConfigWatcher sees the new content and swaps state exactly as for an edited config
file (in-flight requests keep their snapshot). So the apiserver sees one set of watches per
router replica whatever `--workers` is, and both modes share one apply path.

It runs on its own asyncio loop in a thread of the parent (like the admin server). Before
the first full sync (every resource listed once) the file holds an empty config and
/readyz answers 503. Changes are debounced (a `kubectl apply` of many objects is one
build). After every sync the `on_view` hooks get the ClusterView. Unless --no-status, one of
them is the StatusPublisher (status_publisher.py): the Lease election and the status writer
run as tasks of this loop on the same apiserver connection; stopping releases the Lease.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from kthena_router.config.external_provider_parse import SECRET_LABEL
from kthena_router.config.loader import KTHENA_GROUP
from kthena_router.settings import RouterSettings

from . import metrics as m
from .assemble import KINDS, Assembler, Snapshot, render, trim_object, trim_pod, trim_secret
from .client import KubeApi, connect
from .reflector import Reflector, Resource
from .status_publisher import StatusPublisher
from .view import ClusterView

log = logging.getLogger(__name__)

__all__ = ["KubeSource", "OnView", "resources"]

OnView = Callable[[ClusterView], "Awaitable[None] | None"]
VERSION = "v1alpha1"
PLURALS = {"ModelRoute": "modelroutes", "ModelServer": "modelservers",
           "ExternalModelProvider": "externalmodelproviders"}
DEBOUNCE_S = 0.05


def resources(namespace: str) -> dict[str, Resource]:
    """kind -> what to watch; namespace "" = cluster-wide."""
    ns = f"/namespaces/{namespace}" if namespace else ""
    out = {kind: Resource(plural, f"/apis/{KTHENA_GROUP}/{VERSION}{ns}/{plural}", {})
           for kind, plural in PLURALS.items()}
    out["Secret"] = Resource("secrets", f"/api/v1{ns}/secrets", {"labelSelector": f"{SECRET_LABEL[0]}={SECRET_LABEL[1]}"})
    out["Pod"] = Resource("pods", f"/api/v1{ns}/pods", {})
    return out


class KubeSource:
    def __init__(self, settings: RouterSettings, on_view: Sequence[OnView] = ()) -> None:
        self.settings = settings
        self.path = Path(settings.config_path)
        self.on_view = list(on_view)
        self.assembler = Assembler(source=f"kubernetes ({settings.namespace or 'all namespaces'})")
        self.synced = threading.Event()  # first full sync written
        self.presync_digest = ""  # the empty config written before it
        self.digest = ""  # of the file as last written
        self.view: ClusterView | None = None
        self.reflectors: dict[str, Reflector] = {}
        self.last_error = ""
        self._dirty: asyncio.Event | None = None
        self._view_ready: asyncio.Event | None = None
        self._pending_view: ClusterView | None = None
        self._logged_problems: dict[Any, str] = {}
        self._logged_warnings: set[str] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self.status: StatusPublisher | None = None

    # --- the file the workers load ---------------------------------------------------

    def write_initial(self) -> None:
        """The empty config the workers start with (before the first sync)."""
        text = render([]) + b"# waiting for the first Kubernetes sync\n"
        self.presync_digest = self._write(text)

    def _write(self, text: bytes) -> str:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # Secrets' values may be inside
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)
        os.replace(tmp, self.path)
        self.digest = hashlib.sha256(text).hexdigest()
        return self.digest

    def reason_not_synced(self) -> str:
        pending = [r.resource.name for r in self.reflectors.values() if not r.synced]
        errors = [f"{r.resource.name}: {r.last_error}" for r in self.reflectors.values() if r.last_error]
        text = "waiting for the first Kubernetes sync"
        if pending:
            text += f" (not listed yet: {', '.join(pending)})"
        if errors or self.last_error:
            text += "; last errors: " + "; ".join(errors or [self.last_error])
        return text

    # --- thread ------------------------------------------------------------------------

    def start(self) -> None:
        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._main = loop.create_task(self.run())
            try:
                loop.run_until_complete(self._main)
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("Kubernetes watch stopped")
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="kthena-kube", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        loop, main = self._loop, self._main
        if loop is not None and main is not None and self._thread is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(main.cancel)
            self._thread.join(timeout=10)  # the Lease release may take a request (5 s timeout)

    # --- the watch ---------------------------------------------------------------------

    async def run(self) -> None:
        self._dirty = asyncio.Event()
        self._view_ready = asyncio.Event()
        m.SYNCED.set(0)
        api = await self._connect()
        try:
            for kind, res in resources(self.settings.namespace).items():
                transform = trim_pod if kind == "Pod" else trim_secret if kind == "Secret" else trim_object
                self.reflectors[kind] = Reflector(api, res, self._dirty.set, self._watch_failed,
                                                  watch_timeout_s=self.settings.kube_watch_timeout_s,
                                                  transform=transform)
                m.WATCH_HEALTHY.labels(resource=res.name).set(0)
            tasks = [asyncio.create_task(r.run(), name=f"watch-{k}") for k, r in self.reflectors.items()]
            if self.settings.kube_status:
                self.status = StatusPublisher(api.api, self.settings)
                self.on_view.append(self.status.update)
                tasks.append(asyncio.create_task(self.status.run(), name="kube-status"))
            tasks.append(asyncio.create_task(self._sync_loop(), name="kube-sync"))
            tasks.append(asyncio.create_task(self._view_loop(), name="kube-view"))
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await api.close()

    async def _connect(self) -> KubeApi:
        delay = 0.5
        while True:
            try:
                return await connect(self.settings.kubeconfig, self.settings.kube_context)
            except Exception as exc:  # e.g. in-cluster token not mounted yet
                self.last_error = f"cannot load Kubernetes credentials: {exc}"
                log.warning("%s; retrying in %.1fs", self.last_error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _watch_failed(self, resource: str, reason: str) -> None:
        m.WATCH_ERRORS.labels(resource=resource, reason=reason).inc()
        if reason != "gone":
            m.WATCH_HEALTHY.labels(resource=resource).set(0)

    async def _sync_loop(self) -> None:
        assert self._dirty is not None
        while True:
            await self._dirty.wait()
            await asyncio.sleep(DEBOUNCE_S)  # one build for a burst of events
            self._dirty.clear()
            for r in self.reflectors.values():
                if r.synced and not r.last_error:
                    m.WATCH_HEALTHY.labels(resource=r.resource.name).set(1)
            if not all(r.synced for r in self.reflectors.values()):
                continue
            self.sync_once()

    def sync_once(self) -> None:
        snap = Snapshot(objects={k: self.reflectors[k].store for k in KINDS},
                        secrets=self.reflectors["Secret"].store, pods=self.reflectors["Pod"].store)
        try:
            asm = self.assembler.assemble(snap)
        except Exception as exc:  # not attributable to one object (or a bug): keep the last state
            self.last_error = f"cannot build the config from the cluster: {exc}"
            log.error("%s; keeping the last state", self.last_error)
            m.SYNCS.labels(result="failed").inc()
            return
        self.last_error = ""
        self._report(asm.view, asm.pod_problems, asm.dropped)
        digest = hashlib.sha256(asm.text).hexdigest()
        if digest != self.digest:
            self._write(asm.text)
            m.SYNCS.labels(result="applied").inc()
            log.info("config from the cluster: %d routes, %d servers, %d providers (sha256 %s)",
                     len(asm.view.config.routes), len(asm.view.config.servers), len(asm.view.config.providers),
                     digest[:12])
        else:
            m.SYNCS.labels(result="unchanged").inc()
        self.view = asm.view
        if not self.synced.is_set():
            self.synced.set()
            m.SYNCED.set(1)
            log.warning("first Kubernetes sync done (%s)", self.settings.namespace or "all namespaces")
        self._pending_view = asm.view
        assert self._view_ready is not None
        self._view_ready.set()

    def _report(self, view: ClusterView, pod_problems: Sequence[str], dropped: Sequence[str]) -> None:
        """Log each problem once (when it appears or changes), count invalid objects per kind."""
        current: dict[Any, str] = {**{k: v for k, v in view.problems.items()},
                                   **{p: p for p in pod_problems}, **{d: d for d in dropped}}
        for key, text in current.items():
            if self._logged_problems.get(key) != text:
                if isinstance(key, tuple):
                    kind, ns, name = key
                    kept = "its last good version is served" if key in self.assembler.last_good else "left out"
                    log.error("invalid %s %s/%s (%s): %s", kind, ns, name, kept, text)
                else:
                    log.error("%s", text)
        for key in self._logged_problems.keys() - current.keys():
            if isinstance(key, tuple):
                log.warning("%s %s/%s is valid again", *key)
        self._logged_problems = current
        for kind in KINDS:
            m.INVALID_OBJECTS.labels(kind=kind).set(sum(1 for k in view.problems if k[0] == kind))
        for w in set(view.config.warnings) - self._logged_warnings:
            log.info("config: %s", w)
        self._logged_warnings = set(view.config.warnings)

    async def _view_loop(self) -> None:
        """Hand the newest view to the hooks, one call at a time (a slow hook skips views)."""
        assert self._view_ready is not None
        while True:
            await self._view_ready.wait()
            self._view_ready.clear()
            view = self._pending_view
            if view is None:
                continue
            for hook in self.on_view:
                try:
                    res = hook(view)
                    if inspect.isawaitable(res):
                        await res
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("on_view hook failed")
