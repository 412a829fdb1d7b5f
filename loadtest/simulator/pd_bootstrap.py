"""SGLang's PD bootstrap protocol, on both sides.

The router sends the same request to a prefill and a decode engine at once, each with
`bootstrap_host`, `bootstrap_port` (the prefill engine's bootstrap server; SGLang's
--disaggregation-bootstrap-port, 8998 by default) and `bootstrap_room` (a random 63-bit
integer naming the pair). The decode engine connects to the bootstrap server and waits;
the prefill engine computes the prompt, waits for its decode peer (at most
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s), pushes the KV (transfer time over the
link), then answers (one token: SGLang's prefill mode stops after the prefill). The decode
engine waits at most SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s), then decodes.

Here the bootstrap server is a separate listener per prefill engine; its internal
`POST /sim/bootstrap/claim {"bootstrap_room": N}` is the decode side's bootstrap + wait for
the KV: it answers once the room's KV has been pushed, or with the room's failure. Failure
texts are SGLang's (KVTransferError reasons): a prefill that went away fails its decode
with "Aborted by AbortReq.", a decode that went away fails its prefill, an unreachable
bootstrap server is "Failed to get kvcache from prefill instance, it might be dead".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .http_errors import json_response
from .kv_transfer import CONNECT_TIMEOUT_S, KvLoadError, PdCounters, PdSettings
from .pd_nixl import Received

CLAIM_PATH = "/sim/bootstrap/claim"
DEAD_PREFILL = "Failed to get kvcache from prefill instance, it might be dead"
PREFILL_ABORTED = "Aborted by AbortReq."


@dataclass
class _Room:
    decode_arrived: asyncio.Event = field(default_factory=asyncio.Event)
    decode_gone: bool = False
    prefill_seen: bool = False
    result: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class BootstrapPrefill:
    """The rooms of one prefill engine and its bootstrap server's endpoints."""

    def __init__(self, settings: PdSettings, counters: PdCounters) -> None:
        self.s = settings
        self.c = counters
        self.port = settings.side_port
        self._rooms: dict[int, _Room] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_post(CLAIM_PATH, self.claim)
        app.router.add_get("/health", self.health)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    def _room(self, room_id: int) -> _Room:
        room = self._rooms.get(room_id)
        if room is None:
            room = self._rooms[room_id] = _Room()
        return room

    def _drop(self, room_id: int, room: _Room) -> None:
        if self._rooms.get(room_id) is room:
            del self._rooms[room_id]

    async def send(self, room_id: int, handle: Any, num_tokens: int) -> Received:
        """Prefill side, after the prompt is computed: wait for the decode, push the KV.
        Raises KvLoadError (the prefill request fails too)."""
        room = self._room(room_id)
        room.prefill_seen = True
        self.c.kv_held += 1
        try:
            if not room.decode_arrived.is_set():
                wait = self.s.hold_timeout
                try:
                    await asyncio.wait_for(room.decode_arrived.wait(), self.s.wall(wait))
                except asyncio.TimeoutError:
                    self.c.kv_expired += 1
                    raise KvLoadError(f"Request {room_id} timed out after {wait:.1f}s in "
                                      "KVPoll.Bootstrapping", room_id) from None
            if room.decode_gone:
                raise KvLoadError("Decode instance could be dead, remote session of room "
                                  f"{room_id} is not alive", room_id)
            num_bytes = self.s.transfer.kv_bytes(num_tokens)
            seconds = self.s.transfer.seconds(num_bytes)
            await asyncio.sleep(self.s.wall(seconds))
            got = Received(num_tokens, num_bytes, seconds)
            if not room.result.done():
                room.result.set_result(got)
            self.c.kv_sent += 1
            self.c.kv_sent_bytes += num_bytes
            return got
        except KvLoadError as e:
            self._fail(room, e.reason)
            raise
        except BaseException:  # the prefill request went away (or the engine stopped)
            self._fail(room, PREFILL_ABORTED)
            raise
        finally:
            handle.release_kv()
            self.c.kv_held -= 1
            if room.decode_arrived.is_set():
                self._drop(room_id, room)
            else:  # failed before its decode came: kept to tell that decode why
                self._drop_later(room_id, room)

    def fail(self, room_id: int, reason: str = PREFILL_ABORTED) -> None:
        """The prefill hop ended before its KV was ready (error, client gone)."""
        room = self._room(room_id)
        self._fail(room, reason)
        if room.decode_arrived.is_set():
            self._drop(room_id, room)
        else:
            self._drop_later(room_id, room)

    def _drop_later(self, room_id: int, room: _Room) -> None:
        """Keep a room whose other hop may still come (to fail it), not forever."""
        asyncio.get_running_loop().call_later(self.s.wall(self.s.hold_timeout), self._drop,
                                              room_id, room)

    @staticmethod
    def _fail(room: _Room, reason: str) -> None:
        if not room.result.done():
            room.result.set_exception(KvLoadError(reason))
            room.result.exception()  # retrieved: no "never retrieved" warning if unclaimed

    async def claim(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            room_id = body["bootstrap_room"]
            wait = float(body["wait_timeout_s"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return json_response({"error": "malformed claim"}, 400)
        room = self._room(room_id)
        room.decode_arrived.set()
        try:
            got = await asyncio.wait_for(asyncio.shield(room.result), self.s.wall(wait))
        except asyncio.TimeoutError:
            room.decode_gone = True
            if not room.prefill_seen:
                self._drop_later(room_id, room)
            return json_response({"error": f"Request {room_id} timed out after {wait:.1f}s in "
                                           "KVPoll.WaitingForInput"}, 504)
        except KvLoadError as e:
            self._drop(room_id, room)
            return json_response({"error": e.reason}, 500)
        except asyncio.CancelledError:  # the decode went away
            room.decode_gone = True
            if not room.prefill_seen:
                self._drop_later(room_id, room)
            raise
        self._drop(room_id, room)
        return json_response({"num_tokens": got.num_tokens, "num_bytes": got.num_bytes,
                              "transfer_s": got.transfer_s})


async def claim(session: aiohttp.ClientSession, host: Any, port: Any, room: Any,
                settings: PdSettings) -> Received:
    """Decode side: bootstrap with the prefill engine's server and wait for the room's KV."""
    if host in (None, "") or port in (None, "") or not isinstance(room, int):
        raise KvLoadError("missing bootstrap_host, bootstrap_port or bootstrap_room", None)
    wait = settings.wait_timeout_s
    timeout = aiohttp.ClientTimeout(total=settings.wall(wait) + 5.0, sock_connect=CONNECT_TIMEOUT_S)
    try:
        async with session.post(f"http://{host}:{port}{CLAIM_PATH}", timeout=timeout,
                                data=orjson.dumps({"bootstrap_room": room, "wait_timeout_s": wait}),
                                headers={"Content-Type": "application/json"}) as r:
            raw = await r.read()
            status = r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        raise KvLoadError(DEAD_PREFILL, room) from None
    try:
        ans = orjson.loads(raw)
    except orjson.JSONDecodeError:
        ans = {}
    if status != 200 or not isinstance(ans, dict) or "num_tokens" not in ans:
        err = ans.get("error") if isinstance(ans, dict) else None
        raise KvLoadError(err or DEAD_PREFILL, room)
    return Received(int(ans["num_tokens"]), int(ans["num_bytes"]), float(ans["transfer_s"]))
