"""Reload the config when its content changes, or when the reload trigger file changes.

Watches the *directories* (not the file): editors replace files by rename, and a
Kubernetes ConfigMap volume swaps a ``..data`` symlink; both replace the inode a
file watch would follow. Any event in the directory (and a periodic poll, in case
events are lost, e.g. on network file systems) re-reads the file through its path
and compares the sha256 of its content with the last one seen; only a new digest
reloads. A change of the trigger file forces a reload even with the same digest
(the admin endpoint writes a new value into it).

The loader is a parameter: the route config (default) and the router configuration
(--router-config) are watched alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import watchfiles

from .errors import ConfigError, ConfigProblem
from .loader import load_config_bytes

# (content, source path, base dir) -> a validated config with .digest and .warnings
Loader = Callable[[bytes, str, Path], Any]

log = logging.getLogger(__name__)


class ConfigWatcher:
    def __init__(
        self,
        path: str | os.PathLike[str],
        on_config: Callable[[Any], None],
        on_error: Callable[[ConfigError], None],
        trigger_path: str | os.PathLike[str] | None = None,
        *,
        initial_digest: str | None = None,
        loader: Loader = load_config_bytes,
        debounce_ms: int = 100,
        poll_interval_s: float = 2.0,
    ):
        """``initial_digest``: digest of the config already in use (its ``digest``);
        if the file differs when run() starts, it reloads at once. Without it, the
        content at start is taken as current."""
        self.path = Path(os.path.abspath(path))
        self.trigger_path = Path(os.path.abspath(trigger_path)) if trigger_path is not None else None
        self.on_config = on_config
        self.on_error = on_error
        self.loader = loader
        self.debounce_ms = debounce_ms
        self.poll_interval_s = poll_interval_s
        self._digest = initial_digest
        self._trigger_sig: tuple[int, int, int, bytes] | None = None
        self._missing_logged = False
        self._stop = asyncio.Event()
        self.reloads = 0  # successful reloads, for tests and the admin status
        self.errors = 0
        self.wakeups = 0  # event batches and poll timeouts handled

    def stop(self) -> None:
        self._stop.set()

    def _watch_dirs(self) -> list[Path]:
        dirs = [self.path.parent]
        real_parent = Path(os.path.realpath(self.path)).parent
        # A symlink into another directory (not a ConfigMap's ..data subdir, which is
        # swapped as a whole and seen in the parent) is edited there.
        if real_parent != self.path.parent and self.path.parent not in real_parent.parents:
            dirs.append(real_parent)
        if self.trigger_path is not None and self.trigger_path.parent not in dirs:
            dirs.append(self.trigger_path.parent)
        return [d for d in dirs if d.is_dir()]

    def _read_trigger(self) -> tuple[int, int, int, bytes] | None:
        if self.trigger_path is None:
            return None
        try:
            st = self.trigger_path.stat()
            return (st.st_ino, st.st_mtime_ns, st.st_size, self.trigger_path.read_bytes()[:4096])
        except OSError:
            return None

    async def run(self) -> None:
        """Watch until stop() or cancellation. Never raises for a bad or missing file."""
        self._trigger_sig = self._read_trigger()
        if self._digest is None:
            data = self._read()
            self._digest = hashlib.sha256(data).hexdigest() if data is not None else None
        else:
            await self._check(force=False)
        while not self._stop.is_set():
            dirs = self._watch_dirs()
            if not dirs:  # the directory itself is gone (for now): poll until it returns
                await self._sleep(self.poll_interval_s)
                await self._check(force=False)
                continue
            try:
                async for _changes in watchfiles.awatch(
                    *dirs,
                    watch_filter=None,
                    debounce=self.debounce_ms,
                    step=min(50, self.debounce_ms),
                    stop_event=self._stop,
                    rust_timeout=int(self.poll_interval_s * 1000),
                    yield_on_timeout=True,  # an empty batch every poll interval: re-check anyway
                    recursive=False,
                ):
                    await self._on_wake()
                    if set(self._watch_dirs()) != set(dirs):
                        break  # a directory appeared or vanished: re-arm the watch
            except (OSError, RuntimeError) as e:  # e.g. the watched directory was removed
                log.info("config watch on %s interrupted (%s); re-arming", ", ".join(map(str, dirs)), e)
                await self._sleep(min(self.poll_interval_s, 0.5))
                await self._check(force=False)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    async def _on_wake(self) -> None:
        sig = self._read_trigger()
        forced = sig is not None and sig != self._trigger_sig
        if sig is not None:
            self._trigger_sig = sig
        await self._check(force=forced)
        self.wakeups += 1

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cannot read config file %s: %s", self.path, e)
            return None

    async def reload(self) -> None:
        """Reload now, even if the content did not change (for in-process callers)."""
        await self._check(force=True)

    async def _check(self, force: bool) -> None:
        data = await asyncio.to_thread(self._read)
        if data is None:
            # Transient during some replace patterns; keep the old config.
            if force:
                self._report(ConfigError([ConfigProblem(str(self.path), "", "", "file not found")]))
            elif not self._missing_logged:
                log.info("config file %s is absent; keeping the current config", self.path)
                self._missing_logged = True
            return
        self._missing_logged = False
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest and not force:
            return
        # A bad file is remembered too, so it is reported once, not at every poll.
        self._digest = digest
        try:
            cfg = await asyncio.to_thread(self.loader, data, str(self.path), self.path.parent)
        except ConfigError as e:
            self._report(e)
            return
        except Exception as e:  # a loader bug must not stop the watcher
            log.exception("unexpected error loading %s", self.path)
            self._report(ConfigError([ConfigProblem(str(self.path), "", "", f"internal error: {e!r}")]))
            return
        for w in cfg.warnings:
            log.warning("config: %s", w)
        self.reloads += 1
        log.info("config reloaded from %s (sha256 %s)", self.path, digest[:12])
        try:
            self.on_config(cfg)
        except Exception:
            log.exception("on_config callback failed")

    def _report(self, err: ConfigError) -> None:
        self.errors += 1
        log.warning("invalid config, keeping the previous one:\n%s", err)
        try:
            self.on_error(err)
        except Exception:
            log.exception("on_error callback failed")
