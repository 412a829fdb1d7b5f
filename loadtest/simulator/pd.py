"""One engine's PD side: which hop a request is, getting and keeping its KV, PD failures.

server.py calls, per request: plan() after validation (None: an ordinary request),
acquire() before a decode hop is scheduled, finish() when a prefill hop's generation is
done, end() when the hop's handler exits, aborted() when the client went away. Failures
are answered as the engine of the flavour answers them (see PdError).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from . import pd_bootstrap, pd_nixl
from .http_errors import DONE, SSE_HEADERS, ApiError, error_response
from .kv_transfer import KvLoadError, PdCounters, PdSettings

log = logging.getLogger("loadtest.simulator")
MAX_ROOM = (1 << 63) - 1


class PdError(ApiError):
    """vLLM: {"error": {...}}, a KV load failure is a bare "Internal server error" (the
    reason is only logged). SGLang: its flat {"object": "error", ...} body with the
    KVTransferError text."""

    def __init__(self, flavour: str, status: int, message: str, type_: str) -> None:
        super().__init__(status, message, type_)
        self.flavour = flavour

    def response(self) -> web.Response:
        if self.flavour == "vllm":
            return error_response(self.status, self.message, self.type)
        body = {"object": "error", "message": self.message, "type": self.type, "param": None,
                "code": self.status}
        return web.Response(status=self.status, body=orjson.dumps(body),
                            content_type="application/json")

    def sse(self) -> bytes:
        """The error event a stream ends with (then [DONE]), as both engines send it."""
        err = {"message": self.message, "type": self.type, "param": None, "code": self.status}
        return b"data: " + orjson.dumps({"error": err}) + b"\n\n"


@dataclass
class PdPlan:
    hop: str  # prefill | decode
    kv: dict[str, Any] | None = None  # vLLM decode: the request's kv_transfer_params
    room: Any = None  # SGLang: bootstrap_room / _host / _port as received
    host: Any = None
    port: Any = None
    rid: str = ""  # engine request id (vLLM's remote_request_id)
    handle: Any = None  # the engine handle of the hop's generation
    kv_tokens: int = 0  # decode: prompt tokens whose KV arrived
    answered: bool = False  # decode, vLLM stream: the failure event was already written
    settled: bool = False  # prefill: KV handed over to the holder / room
    info: dict[str, Any] = field(default_factory=dict)  # the request log's "pd" entry


class PdEngine:
    def __init__(self, settings: PdSettings, index: int) -> None:
        self.s = settings
        self.index = index
        self.c = PdCounters()
        connector = settings.role != "both"
        self.nixl = pd_nixl.NixlPrefill(settings, self.c) \
            if connector and settings.flavour == "vllm" else None
        self.boot = pd_bootstrap.BootstrapPrefill(settings, self.c) \
            if settings.flavour == "sglang" and settings.role == "prefill" else None
        self._fetches = connector and (settings.flavour == "vllm" or settings.role == "decode")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def port(self) -> int | None:
        side = self.nixl or self.boot
        return side.port if side is not None else None

    async def start(self) -> None:
        side = self.nixl or self.boot
        if side is not None:
            app = web.Application()
            side.routes(app)
            self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.s.host, self.s.side_port, reuse_address=True)
            await site.start()
            side.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self._fetches:
            self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        if self.nixl is not None:
            self.nixl.release_all()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- per request ----------------------------------------------------------------
    def plan(self, body: dict[str, Any], gen: Any, entry: dict[str, Any]) -> PdPlan | None:
        """The request's hop; None for an ordinary request. gen: request_validation.Gen (mutated:
        SGLang's prefill mode generates one token)."""
        if self.s.role == "both" or len(gen.prompts) != 1:
            return None
        plan: PdPlan | None = None
        if self.s.flavour == "vllm":
            kv = body.get("kv_transfer_params")
            if isinstance(kv, dict) and kv.get("do_remote_decode"):
                plan = PdPlan("prefill")
            elif isinstance(kv, dict) and pd_nixl.decode_params(kv) is not None:
                plan = PdPlan("decode", kv=kv)
        elif self.s.role == "prefill":
            room = body.get("bootstrap_room")
            if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room <= MAX_ROOM:
                raise PdError("sglang", 400, "bootstrap_room is required in PREFILL mode "
                              "(an integer in [0, 2^63))", "BadRequestError")
            plan = PdPlan("prefill", room=room)
            gen.max_tokens = 1
        else:
            plan = PdPlan("decode", room=body.get("bootstrap_room"),
                          host=body.get("bootstrap_host"), port=body.get("bootstrap_port"))
        if plan is not None:
            plan.info = entry["pd"] = {"hop": plan.hop}
            if plan.room is not None:
                plan.info["bootstrap_room"] = plan.room
            if plan.hop == "prefill":
                self.c.prefill_requests += 1
        return plan

    async def acquire(self, request: web.Request, plan: PdPlan, prompt_len: int,
                      stream: bool) -> web.StreamResponse | None:
        """Decode hop: get the prompt's KV before scheduling. -> the SSE response when it
        is already open (vLLM sends 200 and the headers before the engine runs)."""
        resp = None
        if stream and self.s.flavour == "vllm":
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
        t0 = time.monotonic()
        assert self._session is not None
        try:
            if self.s.flavour == "vllm":
                got = await pd_nixl.fetch(self._session, plan.kv or {}, prompt_len, self.s)
            else:
                got = await pd_bootstrap.claim(self._session, plan.host, plan.port, plan.room,
                                               self.s)
        except KvLoadError as e:
            self.c.kv_load_failures += 1
            plan.info["error"] = e.reason
            log.warning("engine %d: KV load failed (request_id=%s): %s", self.index,
                        request.headers.get("x-request-id"), e.reason)
            if self.s.load_failure_policy == "recompute":
                self.c.kv_recomputed += 1
                plan.info["recomputed"] = True
                return resp
            err = self._load_error(e, request, plan)
            if resp is None:
                raise err from None
            await resp.write(err.sse() + DONE)
            await resp.write_eof()
            plan.answered = True
            return resp
        wait_s = (time.monotonic() - t0) / self.s.time_scale
        plan.kv_tokens = min(got.num_tokens, prompt_len)
        c = self.c
        c.remote_prefill_decodes += 1
        c.kv_received_bytes += got.num_bytes
        c.kv_transfer_seconds += got.transfer_s
        c.kv_wait_seconds += wait_s
        plan.info.update(kv_tokens=got.num_tokens, kv_bytes=got.num_bytes,
                         kv_transfer_s=got.transfer_s, kv_wait_s=wait_s)
        return resp

    def _load_error(self, e: KvLoadError, request: web.Request, plan: PdPlan) -> PdError:
        if self.s.flavour == "vllm":  # kv_load_failure_policy "fail": finish_reason "error"
            return PdError("vllm", 500, "Internal server error", "InternalServerError")
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex  # SGLang's rid shape
        room = plan.room if isinstance(plan.room, int) else None
        return PdError("sglang", 500, f"Decode transfer failed for request rank=0 "
                       f"decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={room} with "
                       f"exception KVTransferError(bootstrap_room={room}): {e.reason}", "500")

    async def finish(self, plan: PdPlan, handle: Any) -> dict[str, Any] | None:
        """Prefill hop, generation done: keep the KV for the decode (vLLM: -> the reply's
        kv_transfer_params) or push it to the room's decode (SGLang; raises PdError)."""
        plan.settled = True
        if self.nixl is not None:
            if handle.finish_reason != "length":  # vLLM frees an aborted prefill's blocks
                return None
            params = self.nixl.hold(plan.rid, handle, handle.prompt_len)
            plan.info["remote_block_ids"] = len(params["remote_block_ids"])
            return params
        assert self.boot is not None
        try:
            got = await self.boot.send(plan.room, handle, handle.prompt_len)
        except KvLoadError as e:
            plan.info["error"] = e.reason
            log.warning("engine %d: KV push failed (room %s): %s", self.index, plan.room, e.reason)
            raise PdError("sglang", 500, f"Prefill transfer failed for request rank=0 "
                          f"req.rid='{plan.rid}' req.bootstrap_room={plan.room} with exception "
                          f"KVTransferError(bootstrap_room={plan.room}): {e.reason}", "500") from None
        plan.info.update(kv_bytes=got.num_bytes, kv_transfer_s=got.transfer_s)
        return None

    async def finish_stream(self, plan: PdPlan, handle: Any) -> bytes:
        """finish() in a stream: -> b"" or the error event to end it with."""
        try:
            await self.finish(plan, handle)
        except PdError as e:
            return e.sse()
        return b""

    def end(self, plan: PdPlan) -> None:
        """The hop's handler exits: a prefill that never handed its KV over frees it (and
        fails its room, so that the decode waiting there stops)."""
        if plan.hop != "prefill" or plan.settled:
            return
        if plan.handle is not None:
            plan.handle.release_kv()
        if self.boot is not None:
            self.boot.fail(plan.room)

    def aborted(self, entry: dict[str, Any]) -> None:
        info = entry.get("pd")
        if info is None:
            return
        info["aborted"] = True
        if info["hop"] == "prefill":
            self.c.aborted_prefill += 1
        else:
            self.c.aborted_decode += 1
        log.warning("engine %d: %s hop aborted by the client (request_id=%s)", self.index,
                    info["hop"], entry.get("request_id"))

    def reset_counters(self) -> None:
        """With the request log (admin reset); kv_held is a level, not a count: kept."""
        held = self.c.kv_held
        for k, v in vars(PdCounters()).items():
            setattr(self.c, k, v)
        self.c.kv_held = held

    def state(self) -> dict[str, Any]:
        return {"role": self.s.role, "kv_port": self.port, **self.c.to_json()}
