"""vLLM NixlConnector's `kv_transfer_params`, on both sides.

Prefill side: a request with `kv_transfer_params: {"do_remote_decode": true}` runs as usual;
if it finishes by length (max_tokens, 1 in practice), its KV blocks are kept and the reply
carries what vLLM's NixlConnectorScheduler.request_finished returns:
`{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [...],
"remote_engine_id": ..., "remote_request_id": ..., "remote_host": ..., "remote_port": ...,
"tp_size": 1}`. remote_host/remote_port name this engine's side channel (vLLM:
VLLM_NIXL_SIDE_CHANNEL_HOST/PORT), a separate listener whose internal endpoint
`POST /sim/nixl/read` stands for the NIXL handshake + RDMA read + completion notification:
it takes the transfer time (the sender's link), then frees the blocks. Unread blocks are
freed after the hold timeout (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).

Decode side: a request whose `kv_transfer_params` has `do_remote_prefill` reads the blocks
named there before it is scheduled; its prompt then costs no prefill compute. A read that
fails (missing fields, unreachable host/port, wrong engine id, unknown or expired request,
other block ids) is a KV load failure (pd.py applies kv_load_failure_policy).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .http_errors import json_response
from .kv_transfer import CONNECT_TIMEOUT_S, KvLoadError, PdCounters, PdSettings

READ_PATH = "/sim/nixl/read"
REQUIRED = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
            "remote_port")


@dataclass
class _Held:
    handle: Any  # engine handle (release_kv(), block_ids)
    num_tokens: int
    block_ids: list[int]
    expiry: asyncio.TimerHandle | None = None


@dataclass(frozen=True)
class Received:
    num_tokens: int
    num_bytes: int
    transfer_s: float  # simulated


class NixlPrefill:
    """The held KV of one engine and its side-channel read endpoint."""

    def __init__(self, settings: PdSettings, counters: PdCounters) -> None:
        self.s = settings
        self.c = counters
        self.engine_id = str(uuid.uuid4())
        self.port = settings.side_port  # the real one once listening
        self._held: dict[str, _Held] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_post(READ_PATH, self.read)

    def hold(self, request_id: str, handle: Any, num_tokens: int) -> dict[str, Any]:
        """Keep a finished prefill's blocks for a decode engine; -> the reply's params."""
        held = _Held(handle, num_tokens, handle.block_ids)
        loop = asyncio.get_running_loop()
        held.expiry = loop.call_later(self.s.wall(self.s.hold_timeout), self._expire, request_id)
        old = self._held.pop(request_id, None)
        if old is not None:
            self._free(old)
        self._held[request_id] = held
        self.c.kv_held += 1
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": held.block_ids, "remote_engine_id": self.engine_id,
                "remote_request_id": request_id, "remote_host": self.s.host,
                "remote_port": self.port, "tp_size": 1}

    def _free(self, held: _Held) -> None:
        if held.expiry is not None:
            held.expiry.cancel()
        held.handle.release_kv()
        self.c.kv_held -= 1

    def _expire(self, request_id: str) -> None:
        held = self._held.pop(request_id, None)
        if held is not None:
            held.expiry = None
            self._free(held)
            self.c.kv_expired += 1

    def release_all(self) -> None:
        for rid in list(self._held):
            self._free(self._held.pop(rid))

    async def read(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            rid = body["remote_request_id"]
            blocks = body["remote_block_ids"]
            engine_id = body["remote_engine_id"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return json_response({"error": "malformed read request"}, 400)
        if engine_id != self.engine_id:
            return json_response({"error": f"remote engine id {engine_id!r} does not match "
                                           f"this engine ({self.engine_id})"}, 409)
        held = self._held.get(rid) if isinstance(rid, str) else None
        if held is None:
            return json_response({"error": f"no KV held for request {rid!r} (never prefilled "
                                           "here, already read, or expired)"}, 404)
        if blocks != held.block_ids:
            return json_response({"error": f"remote_block_ids do not match the blocks held for "
                                           f"request {rid!r}"}, 409)
        del self._held[rid]
        if held.expiry is not None:
            held.expiry.cancel()
            held.expiry = None
        num_bytes = self.s.transfer.kv_bytes(held.num_tokens)
        seconds = self.s.transfer.seconds(num_bytes)
        try:
            await asyncio.sleep(self.s.wall(seconds))
        finally:  # read done, or the decode gave up: vLLM frees the blocks either way
            self._free(held)
        self.c.kv_sent += 1
        self.c.kv_sent_bytes += num_bytes
        return json_response({"num_tokens": held.num_tokens, "num_bytes": num_bytes,
                              "transfer_s": seconds})


def decode_params(kv: dict[str, Any]) -> dict[str, Any] | None:
    """The request's params if they ask for a remote prefill, else None."""
    return kv if kv.get("do_remote_prefill") else None


async def fetch(session: aiohttp.ClientSession, kv: dict[str, Any], prompt_len: int,
                settings: PdSettings) -> Received:
    """Read the prompt's KV from the prefill engine the params name."""
    missing = [k for k in REQUIRED if kv.get(k) in (None, "", [])]
    if missing:
        raise KvLoadError(f"invalid kv_transfer_params: missing {', '.join(missing)}")
    blocks = kv["remote_block_ids"]
    need = -(-prompt_len // settings.transfer.block_size)
    if not isinstance(blocks, list) or len(blocks) != need:
        raise KvLoadError(f"remote_block_ids has {len(blocks) if isinstance(blocks, list) else '?'}"
                          f" blocks; the prompt ({prompt_len} tokens) needs {need}")
    url = f"http://{kv['remote_host']}:{kv['remote_port']}{READ_PATH}"
    body = {k: kv[k] for k in ("remote_request_id", "remote_block_ids", "remote_engine_id")}
    timeout = aiohttp.ClientTimeout(total=settings.wall(settings.wait_timeout_s),
                                    sock_connect=CONNECT_TIMEOUT_S)
    try:
        async with session.post(url, data=orjson.dumps(body), timeout=timeout,
                                headers={"Content-Type": "application/json"}) as r:
            raw = await r.read()
            status = r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        raise KvLoadError(f"NIXL handshake with {kv['remote_host']}:{kv['remote_port']} "
                          f"failed: {e or type(e).__name__}") from None
    try:
        ans = orjson.loads(raw)
    except orjson.JSONDecodeError:
        ans = {}
    if status != 200 or not isinstance(ans, dict) or "num_tokens" not in ans:
        err = ans.get("error") if isinstance(ans, dict) else None
        raise KvLoadError(f"KV read from {kv['remote_host']}:{kv['remote_port']} failed "
                          f"({status}): {err or raw[:200]!r}")
    return Received(int(ans["num_tokens"]), int(ans["num_bytes"]), float(ans["transfer_s"]))
