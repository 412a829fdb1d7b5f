"""The hub and two worker clients in one event loop (real unix sockets, no router): inserts
reach the other worker only, a late worker gets the replay, and a hub that goes away flips
the workers to local mode without blocking their sends; they reconnect when it is back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kthena_router._core import BlockHashes
from kthena_router.podstate import client as client_mod
from kthena_router.podstate import wire
from kthena_router.podstate.client import PodStateClient
from kthena_router.podstate.hub import Hub
from kthena_router.settings import RouterSettings


class Worker:
    def __init__(self, path: str) -> None:
        self.inserts: list[tuple[str, list[int]]] = []
        self.modes: list[bool] = []
        self.flight: list[list[tuple[str, int]]] = []
        self.client = PodStateClient(path, on_snapshot=lambda s: None, on_probes=lambda r: None,
                                     on_inserts=self._inserts, on_mode=self.modes.append,
                                     on_flight=self.flight.append)

    def _inserts(self, payload: bytes) -> None:
        self.inserts.extend((k, BlockHashes.from_bytes(c).tolist()) for k, c in wire.decode_inserts(payload))


def _chain(*hashes: int) -> bytes:
    return BlockHashes(list(hashes)).to_bytes()


async def until(pred: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_relay_replay_and_hub_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "RETRY_S", 0.05)
    path = str(tmp_path / "hub.sock")
    settings = RouterSettings(config_path="x.yaml", health_probe_interval_s=0.05)
    hub_task = asyncio.create_task(Hub(settings, path).serve())
    a, b = Worker(path), Worker(path)
    for w in (a, b):
        assert await w.client.connect_first(attempts=100, delay_s=0.02)
        w.client.start()
    a.client.send_insert("127.0.0.1:1", _chain(1, 2, 3))
    a.client.send_insert("127.0.0.1:2", _chain(4))  # same loop iteration: one frame
    await until(lambda: len(b.inserts) == 2)
    assert b.inserts == [("127.0.0.1:1", [1, 2, 3]), ("127.0.0.1:2", [4])]
    assert a.inserts == [] and a.client.inserts_sent == 1
    late = Worker(path)  # a (re)started worker: the replay log first
    assert await late.client.connect_first()
    late.client.start()
    await until(lambda: len(late.inserts) == 2)

    hub_task.cancel()
    await asyncio.gather(hub_task, return_exceptions=True)
    await until(lambda: a.modes[-1:] == [False] and b.modes[-1:] == [False])
    a.client.send_insert("127.0.0.1:1", _chain(9))  # no hub: dropped at once, never waits
    assert not a.client.connected

    hub_task = asyncio.create_task(Hub(settings, path).serve())
    await until(lambda: a.client.connected and b.client.connected)
    assert a.modes[-1] is True
    for w in (a, b, late):
        await w.client.close()
    hub_task.cancel()
    await asyncio.gather(hub_task, return_exceptions=True)


@pytest.mark.asyncio
async def test_no_hub_means_local_mode_after_bounded_attempts(tmp_path: Path) -> None:
    w = Worker(str(tmp_path / "nobody.sock"))
    assert not await w.client.connect_first(attempts=3, delay_s=0.01)
    assert w.modes == [False]


@pytest.mark.asyncio
async def test_in_flight_changes_netted_per_iteration_to_the_other_worker(tmp_path: Path) -> None:
    path = str(tmp_path / "hub.sock")
    settings = RouterSettings(config_path="x.yaml", health_probe_interval_s=60)
    hub = Hub(settings, path)
    hub_task = asyncio.create_task(hub.serve())
    a, b = Worker(path), Worker(path)
    for w in (a, b):
        assert await w.client.connect_first(attempts=100, delay_s=0.02)
        w.client.start()
    await until(lambda: sum(1 for c in hub.conns if c.pid) == 2)  # both said hello
    for key, delta in (("127.0.0.1:1", 1), ("127.0.0.1:2", 1), ("127.0.0.1:1", 1), ("127.0.0.1:2", -1)):
        a.client.send_flight(key, delta)  # one loop iteration: one frame, netted, zeros left out
    await until(lambda: len(b.flight) == 1)
    a.client.send_flight("127.0.0.1:1", -2)
    await until(lambda: len(b.flight) == 2)
    assert b.flight == [[("127.0.0.1:1", 2)], [("127.0.0.1:1", -2)]]
    b.client.send_flight("127.0.0.1:3", 1)
    await until(lambda: len(a.flight) == 1)
    assert a.flight == [[("127.0.0.1:3", 1)]] and len(b.flight) == 2  # never back to the sender
    for w in (a, b):
        await w.client.close()
    hub_task.cancel()
    await asyncio.gather(hub_task, return_exceptions=True)


@pytest.mark.asyncio
async def test_the_link_says_the_hub_relays_inserts_until_the_first_attempt_fails(tmp_path: Path) -> None:
    """A worker's shared-index reader skips its own pod's Redis entries while this is true: before
    the first attempt (the hub's replay is about to deliver them), while connected, not after a
    failed first attempt (local mode: Redis is then its only source)."""
    from types import SimpleNamespace

    from kthena_router.podstate.link import PodStateLink

    path = str(tmp_path / "hub.sock")
    settings = RouterSettings(config_path="x.yaml", health_probe_interval_s=60, pod_state_socket=path,
                              runtime_dir=str(tmp_path))
    alone = PodStateLink(settings, None, SimpleNamespace(remote=False), lambda: None)  # type: ignore[arg-type]
    assert alone.relays_inserts()
    assert not await alone.client.connect_first(attempts=2, delay_s=0.01)
    assert not alone.relays_inserts()

    hub_task = asyncio.create_task(Hub(settings, path).serve())
    link = PodStateLink(settings, None, SimpleNamespace(remote=False), lambda: None)  # type: ignore[arg-type]
    assert await link.client.connect_first(attempts=100, delay_s=0.02)
    assert link.relays_inserts()
    await link.client.close()
    await alone.client.close()
    hub_task.cancel()
    await asyncio.gather(hub_task, return_exceptions=True)
