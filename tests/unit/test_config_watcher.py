"""ConfigWatcher with real files: in-place write, rename-replace, ConfigMap symlink swap,
bad file keeps the old config, trigger file forces a reload, absent file survives.

No fixed sleeps: every wait polls a condition with a generous deadline. The poll
interval is long (60 s), so reloads here come from file system events, not polling.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from config_fixtures import dump, endpoints, route, server

from kthena_router.config import ConfigError, RouterConfig, load_config_file
from kthena_router.config.watcher import ConfigWatcher

DEADLINE_S = 15.0


def config_text(model: str) -> str:
    return dump([route("r", model), server(), endpoints()])


BAD_TEXT = dump([route("r", "m"), server(inferenceEngine="TGI"), endpoints()])


async def wait_until(pred: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Harness:
    dir: Path
    path: Path
    watcher: ConfigWatcher
    configs: list[RouterConfig] = field(default_factory=list)
    errors: list[ConfigError] = field(default_factory=list)
    probes: int = 0

    def models(self) -> list[str | None]:
        return [c.routes[0].model_name for c in self.configs]

    async def armed(self) -> None:
        """Write unrelated files until the watcher reports a wake-up: it now sees events."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        start = self.watcher.wakeups
        while self.watcher.wakeups == start:
            assert loop.time() < deadline, "watcher never woke up"
            self.probes += 1
            (self.dir / f"probe-{self.probes}.txt").write_text(str(self.probes))
            await asyncio.sleep(0.05)

    async def settled(self) -> None:
        """Wait until the watcher has handled an event written after this call."""
        await self.armed()


@asynccontextmanager
async def _start(dir: Path, path: Path, trigger: Path | None = None, initial: str | None = None) -> AsyncIterator[Harness]:
    configs: list[RouterConfig] = []
    errors: list[ConfigError] = []
    if initial is None:
        initial = load_config_file(path).digest
    w = ConfigWatcher(path, configs.append, errors.append, str(trigger) if trigger else None,
                      initial_digest=initial, debounce_ms=50, poll_interval_s=60)
    h = Harness(dir, path, w, configs, errors)
    task = asyncio.create_task(w.run())
    try:
        await h.armed()
        yield h
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE_S)
        assert task.exception() is None


def plain_watch(tmp_path: Path):
    """A watcher on router.yaml (model m1) with trigger file reload.trigger, same dir.

    A context manager, not an async fixture: the watcher task must run on the test's
    own event loop."""
    p = tmp_path / "router.yaml"
    p.write_text(config_text("m1"))
    return _start(tmp_path, p, trigger=tmp_path / "reload.trigger")


async def test_in_place_write_reloads(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        with open(plain.path, "w") as f:  # same inode, truncated and rewritten
            f.write(config_text("m2"))
        await wait_until(lambda: plain.models() == ["m2"], "reload after in-place write")
        assert plain.configs[0].digest == hashlib.sha256(plain.path.read_bytes()).hexdigest()
        assert plain.errors == []


async def test_rename_replace_reloads(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        tmp = plain.dir / ".router.yaml.swp"
        tmp.write_text(config_text("m3"))
        os.replace(tmp, plain.path)  # what editors and atomic writers do
        await wait_until(lambda: plain.models() == ["m3"], "reload after rename-replace")


async def test_same_content_does_not_reload(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        plain.path.write_text(config_text("m1"))  # rewritten, same bytes
        await plain.settled()
        assert plain.configs == [] and plain.errors == []


async def test_bad_file_keeps_old_config_and_reports(tmp_path: Path, caplog):
    async with plain_watch(tmp_path) as plain:
        caplog.set_level(logging.WARNING, logger="kthena_router.config.watcher")
        plain.path.write_text(BAD_TEXT)
        await wait_until(lambda: len(plain.errors) == 1, "on_error")
        err = plain.errors[0]
        assert (err.field, err.document) == ("spec.inferenceEngine", "document 2 (ModelServer default/s)")
        assert err.file == str(plain.path)
        assert plain.configs == []  # on_config never sees a bad config
        assert any("spec.inferenceEngine" in r.getMessage() and str(plain.path) in r.getMessage()
                   for r in caplog.records if r.levelno == logging.WARNING)
        await plain.settled()
        assert len(plain.errors) == 1  # reported once, not at every wake-up
        plain.path.write_text(config_text("fixed"))
        await wait_until(lambda: plain.models() == ["fixed"], "reload after the fix")


async def test_yaml_syntax_error_is_reported_not_raised(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        plain.path.write_text("kind: [unclosed\n")
        await wait_until(lambda: len(plain.errors) == 1, "on_error")
        assert "YAML syntax error" in plain.errors[0].message
        assert not plain.watcher._stop.is_set()
        plain.path.write_text(config_text("after"))
        await wait_until(lambda: plain.models() == ["after"], "reload after syntax error")


async def test_trigger_forces_reload_with_same_content(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        trigger = plain.dir / "reload.trigger"
        trigger.write_text("1")
        await wait_until(lambda: len(plain.configs) == 1, "forced reload")
        assert plain.models() == ["m1"]
        trigger.write_text("2")
        await wait_until(lambda: len(plain.configs) == 2, "second forced reload")


async def test_trigger_with_bad_file_reports_again(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        plain.path.write_text(BAD_TEXT)
        await wait_until(lambda: len(plain.errors) == 1, "first error")
        (plain.dir / "reload.trigger").write_text("x")
        await wait_until(lambda: len(plain.errors) == 2, "error on forced reload")
        assert plain.configs == []


async def test_trigger_in_another_directory(tmp_path: Path):
    cfg_dir, trig_dir = tmp_path / "cfg", tmp_path / "run"
    cfg_dir.mkdir()
    trig_dir.mkdir()
    p = cfg_dir / "router.yaml"
    p.write_text(config_text("m1"))
    async with _start(cfg_dir, p, trigger=trig_dir / "reload") as h:
        (trig_dir / "reload").write_text("now")
        await wait_until(lambda: len(h.configs) == 1, "forced reload via trigger dir")


async def test_absent_file_is_survived(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        plain.path.unlink()
        await plain.settled()
        assert plain.errors == [] and plain.configs == []
        plain.path.write_text(config_text("back"))
        await wait_until(lambda: plain.models() == ["back"], "reload after the file returned")


async def test_initial_digest_mismatch_reloads_at_start(tmp_path: Path):
    p = tmp_path / "router.yaml"
    p.write_text(config_text("current"))
    async with _start(tmp_path, p, initial="0" * 64) as h:
        await wait_until(lambda: h.models() == ["current"], "reload at start")


def _configmap_dir(root: Path, stamp: str, text: str) -> None:
    d = root / f"..{stamp}"
    d.mkdir()
    (d / "router.yaml").write_text(text)


def _swap_data(root: Path, stamp: str) -> None:
    tmp = root / "..data_tmp"
    tmp.symlink_to(f"..{stamp}")
    os.replace(tmp, root / "..data")  # atomic, as kubelet's AtomicWriter does


async def test_configmap_symlink_swap(tmp_path: Path):
    # kubelet's layout: router.yaml -> ..data/router.yaml, ..data -> ..<timestamp>/
    _configmap_dir(tmp_path, "2026_01_01_00_00_00.1", config_text("v1"))
    (tmp_path / "..data").symlink_to("..2026_01_01_00_00_00.1")
    (tmp_path / "router.yaml").symlink_to("..data/router.yaml")
    async with _start(tmp_path, tmp_path / "router.yaml") as h:
        _configmap_dir(tmp_path, "2026_01_01_00_01_00.2", config_text("v2"))
        _swap_data(tmp_path, "2026_01_01_00_01_00.2")
        shutil.rmtree(tmp_path / "..2026_01_01_00_00_00.1")
        await wait_until(lambda: h.models() == ["v2"], "reload after ..data swap")
        _configmap_dir(tmp_path, "2026_01_01_00_02_00.3", BAD_TEXT)
        _swap_data(tmp_path, "2026_01_01_00_02_00.3")
        await wait_until(lambda: len(h.errors) == 1, "error after bad swap")
        assert h.models() == ["v2"]


async def test_polling_catches_changes_without_events(tmp_path: Path, monkeypatch):
    """If the file system gives no events (network mounts), the poll interval still reloads."""
    p = tmp_path / "router.yaml"
    p.write_text(config_text("m1"))
    configs: list[RouterConfig] = []
    w = ConfigWatcher(p, configs.append, lambda e: None,
                      initial_digest=load_config_file(p).digest, debounce_ms=50, poll_interval_s=0.2)
    # Watch an empty directory instead of the real one, so only the poll can notice.
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(w, "_watch_dirs", lambda: [empty])
    task = asyncio.create_task(w.run())
    try:
        p.write_text(config_text("m2"))
        await wait_until(lambda: [c.routes[0].model_name for c in configs] == ["m2"], "reload by polling")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE_S)


async def test_callback_exception_does_not_stop_watcher(tmp_path: Path):
    async with plain_watch(tmp_path) as plain:
        calls: list[RouterConfig] = []

        def boom(cfg: RouterConfig) -> None:
            calls.append(cfg)
            raise RuntimeError("callback bug")

        plain.watcher.on_config = boom
        plain.path.write_text(config_text("x1"))
        await wait_until(lambda: len(calls) == 1, "first callback")
        plain.path.write_text(config_text("x2"))
        await wait_until(lambda: len(calls) == 2, "watcher still running")
