"""Identity in a worker: the installed Authenticator and the sources that keep it current.

`install(cfg)` runs at start and after every router-configuration install (its `auth`
section; None = auth off). An unchanged section keeps the live Authenticator, its keys
and its JWKS; a changed one builds a new Authenticator and restarts the sources:
- the API keys file, watched like the route config (a bad file keeps the old keys: the
  watcher logs the file and field, kthena_router_auth_api_keys_reloads_total{result="failure"});
- the JWKS: from jwksUri, a background refresh (one aiohttp session per worker), or from
  jwksFile, watched like the keys file.
`publish` hands the Authenticator (or None) to the proxy (Forwarder.auth).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from ..config.errors import ConfigError
from ..config.watcher import ConfigWatcher
from ..settings import RouterSettings
from .authenticate import Authenticator
from .config import AuthConfig
from .jwks import JwksStore, load_jwks_bytes
from .jwt_verify import JwtVerifier
from .keys import KeySet, load_keys_bytes
from .metrics import AuthMetrics

__all__ = ["IdentityService"]

log = logging.getLogger(__name__)


class IdentityService:
    def __init__(self, settings: RouterSettings, registry: Any,
                 publish: Callable[[Authenticator | None], None]) -> None:
        self.settings = settings
        self.metrics = AuthMetrics(registry)
        self.publish = publish
        self.cfg: AuthConfig | None = None
        self.auth: Authenticator | None = None
        self.store: JwksStore | None = None
        self._watchers: list[ConfigWatcher] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._running = False

    def install(self, cfg: AuthConfig | None) -> None:
        if cfg == self.cfg and (cfg is None) == (self.auth is None):
            return  # unchanged: keep the keys and JWKS learned since
        self._stop_sources()
        self.cfg, self.store = cfg, None
        if cfg is None:
            self.auth = None
            self.publish(None)
            log.info("authentication off")
            return
        verifier = None
        if cfg.jwt:
            store = self.store = JwksStore(cfg.jwks_uri, cfg.jwks, refresh_s=cfg.jwks_refresh_s,
                                           refetch_min_s=cfg.jwks_refetch_min_s, timeout_s=cfg.jwks_timeout_s)
            store.on_fetch = lambda result: self.metrics.jwks_fetch(result, len(store.keys))
            if cfg.jwks is not None:
                self.metrics.jwks_fetch("ok", len(cfg.jwks.keys))
            verifier = JwtVerifier(cfg, store)
        if cfg.keys is not None:
            self.metrics.keys_reload(True, len(cfg.keys.by_digest))
        self.auth = Authenticator(cfg, cfg.keys, verifier, self.metrics)
        self.publish(self.auth)
        log.info("authentication on: %s", ", ".join(
            what for what, on in (("API keys", cfg.api_keys_file), ("JWT", cfg.jwt)) if on))
        if self._running:
            self._start_sources()

    async def start(self) -> None:
        self._running = True
        self._start_sources()

    async def close(self) -> None:
        self._running = False
        self._stop_sources()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- sources -------------------------------------------------------------------------
    def _start_sources(self) -> None:
        cfg, auth, store = self.cfg, self.auth, self.store
        if cfg is None or auth is None:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [t for t in self._tasks if not t.done()]
        trigger = self.settings.reload_trigger_path or None
        if self.settings.watch_config and cfg.api_keys_file:
            def keys_changed(ks: KeySet) -> None:
                auth.set_keys(ks)
                self.metrics.keys_reload(True, len(ks.by_digest))
                log.info("API keys reloaded from %s: %d key(s)", ks.source, len(ks.by_digest))

            def keys_bad(err: ConfigError) -> None:
                self.metrics.keys_reload(False)  # the watcher logged the file and field

            self._watchers.append(ConfigWatcher(
                cfg.api_keys_file, keys_changed, keys_bad, trigger_path=trigger,
                initial_digest=cfg.keys.digest if cfg.keys is not None else None, loader=load_keys_bytes))
        if store is not None and cfg.jwks_file and self.settings.watch_config:
            self._watchers.append(ConfigWatcher(
                cfg.jwks_file, store.install, store.on_file_error, trigger_path=trigger,
                initial_digest=cfg.jwks.digest if cfg.jwks is not None else None, loader=load_jwks_bytes))
        self._tasks.extend(loop.create_task(w.run()) for w in self._watchers)
        if store is not None and cfg.jwks_uri:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            store.session = self._session  # requests before the first fetch step join it
            self._tasks.append(loop.create_task(store.run(self._session)))

    def _stop_sources(self) -> None:
        for w in self._watchers:
            w.stop()
        self._watchers = []
        if self.store is not None:
            self.store.stop()
        for task in self._tasks:
            if not task.done():
                task.cancel()
