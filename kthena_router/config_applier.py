"""ConfigApplier: turns a loaded RouterConfig into the worker's current state.

Three writers install states: the initial load, reloads (file watch, trigger file) and the
periodic DNS refresh. Two of them await DNS resolution before installing, so an install
could land after a newer one. Each therefore installs with compare-and-swap on the
StateHolder's generation, and a reload superseded by a newer config is dropped:
- a DNS refresh based on a generation that is no longer current installs nothing (a
  reload landed meanwhile; the next refresh re-resolves for the new config);
- a reload installs only while it is the newest config received; if a DNS refresh of the
  older config landed meanwhile, it rebuilds its endpoint lists and installs on top.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kthena_router import worker_status
from kthena_router.config.errors import ConfigError
from kthena_router.config.model import RouterConfig
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.metrics import RouterMetrics
from kthena_router.routing.table import RouteTable
from kthena_router.settings import RouterSettings
from kthena_router.state import RouterState, StateHolder, build_state

log = logging.getLogger(__name__)

DNS_REFRESH_S = 30.0


class ConfigApplier:
    def __init__(self, settings: RouterSettings, holder: StateHolder, registry: EndpointRegistry,
                 metrics: RouterMetrics) -> None:
        self.settings = settings
        self.holder = holder
        self.registry = registry
        self.metrics = metrics
        self.on_swap: Callable[[RouterState], None] | None = None  # after every state install
        self._tasks: set[asyncio.Task[None]] = set()
        self._latest = 0  # ticket of the newest config received

    def _ticket(self) -> int:
        self._latest += 1
        return self._latest

    def _install(self, state: RouterState, based_on: int) -> bool:
        if not self.holder.install(state, based_on):
            return False
        if self.on_swap is not None:
            self.on_swap(state)
        return True

    async def apply(self, cfg: RouterConfig) -> None:
        ticket = self._ticket()
        table = RouteTable.build(cfg)  # first: a table error keeps the old state
        await self.registry.resolve_names(cfg)
        self._swap(cfg, table, ticket)

    def _swap(self, cfg: RouterConfig, table: RouteTable, ticket: int) -> None:
        if ticket != self._latest:
            log.info("config %s superseded by a newer one before it was installed", cfg.digest[:12])
            return
        # No await from here on: the generation read here is still current at install,
        # unless a DNS refresh of the previous config landed while we resolved (then it
        # is read after that install, and the new endpoint lists include its answers).
        targets = self.registry.build(cfg)
        installed = self._install(build_state(cfg, table, targets), self.holder.generation)
        assert installed  # single-threaded: nothing ran between the read and the install
        for eps in targets.values():
            for ep in eps:
                self.metrics.set_endpoint_healthy(ep.server_label, ep.key, ep.health.healthy)
        self.metrics.config_reload(True)
        worker_status.report_applied(self.settings, cfg.digest)

    def on_config(self, cfg: RouterConfig) -> None:
        """ConfigWatcher callback (sync): swap now, or after DNS resolution of new names."""
        ticket = self._ticket()
        try:
            table = RouteTable.build(cfg)
        except Exception as exc:  # the loader validated; this is a bug, keep the old state
            log.exception("cannot build the route table; keeping the previous config")
            self._failed(str(exc))
            return
        if not self.registry.has_names(cfg):
            self._swap(cfg, table, ticket)
            return
        task = asyncio.get_running_loop().create_task(self._resolve_then_swap(cfg, table, ticket))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve_then_swap(self, cfg: RouterConfig, table: RouteTable, ticket: int) -> None:
        await self.registry.resolve_names(cfg)
        self._swap(cfg, table, ticket)

    def on_error(self, err: ConfigError) -> None:
        self._failed(str(err))

    def _failed(self, message: str) -> None:
        self.metrics.config_reload(False)
        worker_status.report_failed(self.settings, message)

    async def refresh_dns_once(self) -> bool:
        """Re-resolve endpoint names; install a rebuilt state when an answer changed and no
        other install happened meanwhile. True if it installed."""
        state, based_on = self.holder.current, self.holder.generation
        if state is None or not self.registry.has_names(state.config):
            return False
        await self.registry.resolve_names(state.config)
        targets = self.registry.build(state.config)
        keys = {k: tuple(ep.key for ep in v) for k, v in targets.items()}
        if keys == {k: tuple(ep.key for ep in v) for k, v in state.targets.items()}:
            return False
        return self._install(build_state(state.config, state.table, targets), based_on)

    async def refresh_dns_forever(self) -> None:
        while True:
            await asyncio.sleep(DNS_REFRESH_S)
            try:
                await self.refresh_dns_once()
            except Exception:
                log.exception("DNS refresh failed")
