"""The reflector's list/watch bookkeeping against a scripted apiserver stand-in: bookmarks move
the resourceVersion, 410 Gone (as an ERROR event) re-lists and replaces the store, other
errors keep the store and back off."""

from __future__ import annotations

import asyncio
from typing import Any

from kthena_router.kube.client import CONNECTED, ApiError
from kthena_router.kube.reflector import Backoff, Reflector, Resource


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "t", "name": name, "resourceVersion": rv}}


class ScriptedApi:
    def __init__(self) -> None:
        self.lists: list[tuple[list[dict[str, Any]], str] | Exception] = []
        self.watches: list[list[dict[str, Any]] | Exception] = []
        self.watch_rvs: list[str] = []

    async def list(self, path: str, params: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def watch(self, path: str, params: dict[str, str], rv: str, timeout_s: float):  # type: ignore[no-untyped-def]
        self.watch_rvs.append(rv)
        if not self.watches:
            await asyncio.sleep(3600)
        item = self.watches.pop(0)
        if isinstance(item, Exception):
            raise item
        yield {"type": CONNECTED}
        for ev in item:
            yield ev


def test_bookmark_gone_relist_and_errors_keep_the_store() -> None:
    api = ScriptedApi()
    api.lists = [([obj("a", "1")], "10"), ([obj("b", "30")], "30")]
    api.watches = [
        [{"type": "ADDED", "object": obj("c", "11")}, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}],
        ApiError(503, "ServiceUnavailable", "down"),
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
    ]
    errors: list[str] = []
    changes = [0]
    r = Reflector(api, Resource("things", "/x", {}), lambda: changes.__setitem__(0, changes[0] + 1),  # type: ignore[arg-type]
                  lambda res, reason: errors.append(reason))
    r.backoff = Backoff(base=0.001, cap=0.001, floor=0.0)

    async def main() -> None:
        task = asyncio.create_task(r.run())
        for _ in range(200):
            await asyncio.sleep(0.005)
            if r.lists == 2 and len(api.watch_rvs) >= 5:
                break
        task.cancel()

    asyncio.run(main())
    # list at 10, watch from 10 (c added, bookmark 20), resume from 20 (503: kept), again from 20 (410: re-list)
    assert api.watch_rvs[:4] == ["10", "20", "20", "30"]
    assert errors[:2] == ["unavailable", "gone"]
    assert set(r.store) == {("t", "b")}  # the re-list replaced the store (a and c are gone)
    assert r.resource_version == "30" and r.synced


def test_backoff_is_jittered_and_capped() -> None:
    b = Backoff(base=0.5, cap=4.0, floor=0.1)
    delays = [b.next() for _ in range(20)]
    assert all(0.1 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 10
    b.reset()
    assert b.failures == 0


def test_on_object_reports_every_change_including_relist_differences() -> None:
    """on_object(key, old, new) per changed object: watch events, and what a re-list after 410
    finds changed (a, gone; b, modified; d, new; c unchanged: not reported)."""
    api = ScriptedApi()
    api.lists = [([obj("a", "1"), obj("b", "2"), obj("c", "3")], "10"),
                 ([obj("b", "31"), obj("c", "3"), obj("d", "32")], "40")]
    api.watches = [
        [{"type": "MODIFIED", "object": obj("a", "11")}, {"type": "DELETED", "object": obj("a", "12")},
         {"type": "ADDED", "object": obj("a", "13")}],
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
    ]
    seen: list[tuple[str, str | None, str | None]] = []

    def on_object(key: tuple[str, str], old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        rv = lambda o: None if o is None else o["metadata"]["resourceVersion"]  # noqa: E731
        seen.append((key[1], rv(old), rv(new)))

    r = Reflector(api, Resource("things", "/x", {}), lambda: None, lambda res, reason: None,  # type: ignore[arg-type]
                  on_object=on_object)
    r.backoff = Backoff(base=0.001, cap=0.001, floor=0.0)

    async def main() -> None:
        task = asyncio.create_task(r.run())
        for _ in range(200):
            await asyncio.sleep(0.005)
            if r.lists == 2:
                break
        task.cancel()

    asyncio.run(main())
    first_list = sorted(seen[:3])
    assert first_list == [("a", None, "1"), ("b", None, "2"), ("c", None, "3")]
    assert seen[3:6] == [("a", "1", "11"), ("a", "11", None), ("a", None, "13")]
    assert sorted(seen[6:]) == [("a", "13", None), ("b", "2", "31"), ("d", None, "32")]
