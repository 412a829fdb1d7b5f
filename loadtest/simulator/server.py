"""One simulated engine port: an aiohttp app that behaves on the wire like vLLM (or SGLang).

Per port: one or more engine instances (DP ranks; requests go to the least busy),
the loaded LoRA adapters, the fault knobs and the request accounting. The listening
socket is owned here so that `refuse_connections` can close and reopen it.

Faults apply to the inference endpoints (chat, completions, responses); /health answers 503
during slow start; `refuse_connections` closes the listener and resets any request
arriving on an already open keep-alive connection (a dead process resets those too).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from .accounting import RequestLog
from .fault_actions import FaultActions
from .fast_engine import GenRequest  # same fields as engine.GenRequest (duck-typed)
from .faults import Faults
from .http_errors import DONE, SSE_HEADERS, ApiError, error_response, json_response
from .metrics_text import RankView, render
from .models import ModelEndpoints
from .pd import PdEngine, PdPlan
from .probes import ProbeEndpoints
from .responses import ResponsesEndpoints, ResponseStore
from .request_validation import Gen, RequestValidation
from .tokenizer import TextCodec

log = logging.getLogger("loadtest.simulator")


def _printable(v: str) -> str:
    """A header value as logged: aiohttp keeps non-UTF-8 bytes as lone surrogates, which the
    admin API's JSON cannot carry."""
    return v if v.isascii() else v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass
class ServerConfig:
    index: int
    host: str
    port: int
    model: str
    flavour: str = "vllm"            # vllm | sglang
    max_loras: int = 4
    max_cpu_loras: int | None = None  # registered adapters (vLLM's); None: max_loras
    loras: list[str] = field(default_factory=list)
    max_model_len: int = 131072
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    seed: int = 0
    fast: bool = False


def _nodelay(request: web.Request) -> bool | None:
    """Whether this connection has TCP_NODELAY (aiohttp sets it on accept)."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None:
        return None
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


class EngineServer(RequestValidation, ProbeEndpoints, ResponsesEndpoints, ModelEndpoints, FaultActions):
    def __init__(self, cfg: ServerConfig, engines: list[Any], codec: TextCodec,
                 faults: Faults | None = None, pd: PdEngine | None = None) -> None:
        self.cfg = cfg
        self.pd = pd  # prefill/decode role (pd.py); None: aggregated, no KV connector
        self.engines = engines
        self.active = [0] * len(engines)  # in-flight requests per DP rank
        self.codec = codec
        self.faults = faults or Faults()
        self.requests = RequestLog()
        self.store = ResponseStore()
        self.loras: dict[str, str] = {name: f"/loras/{name}" for name in cfg.loras}
        self.rng = random.Random(cfg.seed * 7919 + cfg.index)
        self.created = int(time.time())
        self._rr = itertools.count()
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._reserved: socket.socket | None = None  # the port, held while refusing
        # GET /health and /metrics served: how often routers probe and scrape this engine
        self.polls = {"health": 0, "metrics": 0}
        self.app = self._make_app()

    # --- lifecycle ----------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._guard])
        r = app.router
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/responses", self.responses)
        r.add_get("/v1/responses/{response_id}", self.get_response)
        r.add_get("/v1/models", self.models)
        r.add_post("/v1/load_lora_adapter", self.load_lora)
        r.add_post("/v1/unload_lora_adapter", self.unload_lora)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/chat/completions/render", self.render_chat)
        r.add_post("/v1/completions/render", self.render_completions)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.server_info)
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/get_load", self.get_load)
        r.add_get("/load", self.get_load)
        r.add_get("/health_generate", self.health_generate)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/version", self.version)
        return app

    async def start(self) -> None:
        for eng in self.engines:
            await eng.start()
        if self.pd is not None:
            await self.pd.start()
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._release()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.cfg.host, self.cfg.port))
        self.cfg.port = sock.getsockname()[1]  # port 0 -> the one the OS chose, kept after
        sock.listen(1024)
        sock.setblocking(False)
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()

    async def stop(self) -> None:
        # stop listening, end in-flight generations (finish_reason "abort"), then close
        await self.set_refusing(True)
        for eng in self.engines:
            await eng.stop()
        if self.pd is not None:
            await self.pd.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        self._release()

    async def set_refusing(self, refuse: bool) -> None:
        """Close the listening socket (connects get ECONNREFUSED) or reopen it.

        While refusing, the port stays bound by a socket that does not listen: a freed port
        could be taken by another process, or be picked as a connecting socket's own local
        port, which then connects to itself, and the engine would no longer look down."""
        if refuse and self._site is not None:
            site, self._site = self._site, None
            await site.stop()
            self._reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
            self._reserved.bind((self.cfg.host, self.cfg.port))
        elif not refuse and self._site is None:
            await self._listen()

    def _release(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    async def apply_faults(self, patch: dict[str, Any]) -> None:
        self.faults.merge(patch)
        await self.set_refusing(self.faults.refuse_connections)

    async def reset_faults(self) -> None:
        self.faults = Faults()
        await self.set_refusing(False)

    # --- middleware: refused connections and no tracebacks to clients -----------------
    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if self.faults.refuse_connections:
            # a request on a connection opened before the listener closed: reset it
            if request.transport is not None:
                request.transport.abort()
            await asyncio.sleep(3600)  # the connection loss cancels this handler
        try:
            return await handler(request)
        except ApiError as e:
            return e.response()
        except web.HTTPException as e:
            if e.status >= 400:
                return error_response(e.status, e.reason)
            raise
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            if request.transport is None or request.transport.is_closing():
                # the client (a router cancelling upstream work) closed while we wrote: the
                # abort is recorded; a response aiohttp cannot send ends the exchange quietly
                return web.Response(status=499)
            raise
        except Exception:
            log.exception("engine %d: internal error on %s", self.cfg.index, request.path)
            return error_response(500, "internal simulator error")

    # --- helpers ------------------------------------------------------------------------
    def served(self, model: Any) -> tuple[str, str | None]:
        """-> (model name for the response, LoRA adapter or None); 404 if not served."""
        if model is None:
            return self.cfg.model, None
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", param="model")
        if model == self.cfg.model:
            return model, None
        if model in self.loras:
            return model, model
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    def pick_rank(self) -> int:
        n = len(self.engines)
        if n == 1:
            return 0
        start = next(self._rr) % n  # rotate the tie-break so equal ranks take turns
        return min(((start + i) % n for i in range(n)), key=self.active.__getitem__)

    def _starting_error(self) -> ApiError:
        return ApiError(503, "The engine is starting up.", "ServiceUnavailableError")

    # --- inference ----------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, chat=False)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, chat=None)

    async def _inference(self, request: web.Request, chat: bool | None) -> web.StreamResponse:
        """chat: True chat completions, False completions, None responses."""
        headers = {k.lower(): _printable(v) for k, v in request.headers.items()}
        entry = self.requests.add(headers.get("x-request-id"), request.path, headers)
        entry["tcp_nodelay"] = _nodelay(request)
        try:
            return await self._serve(request, entry, chat)
        except ApiError as e:
            entry["http_status"] = e.status
            faulty = e.status >= 500 or entry["fault"] in ("error", "slow_start")
            self.requests.set_status(entry, "errored" if faulty else "rejected")
            return e.response()
        except (asyncio.CancelledError, ConnectionError):
            if entry["status"] in ("running", "stalled"):
                self.requests.set_status(entry, "aborted")
                if self.pd is not None:
                    self.pd.aborted(entry)
            raise
        except Exception:
            entry["http_status"] = 500
            self.requests.set_status(entry, "errored")
            raise

    async def _serve(self, request: web.Request, entry: dict[str, Any],
                     chat: bool | None) -> web.StreamResponse:
        body = await self.read_json(request)
        entry["model"] = body.get("model")
        entry["stream"] = body.get("stream") is True
        f = self.faults
        if f.starting():
            entry["fault"] = "slow_start"
            raise self._starting_error()
        if f.first_byte_delay_s > 0:
            entry["fault"] = "first_byte_delay"
            await asyncio.sleep(f.first_byte_delay_s)
        if f.stall:
            entry["fault"] = "stall"
            self.requests.set_status(entry, "stalled")
            await asyncio.Event().wait()  # until the client goes away (handler cancelled)
        if f.roll_error(self.rng):
            entry["fault"] = "error"
            raise ApiError(f.error_status, "Simulated engine failure (error_rate fault).")
        if f.garbage:
            entry["fault"] = "garbage"
            entry["http_status"] = 200
            self.requests.set_status(entry, "errored")
            return await self._garbage(request, entry["stream"])
        if chat is None:
            return await self.serve_response(request, entry, body)
        gen = await self._validate(body, chat)
        plan = self.pd.plan(body, gen, entry) if self.pd is not None else None
        entry["http_status"] = 200
        if plan is None:
            if gen.stream:
                return await self._stream(request, entry, gen, chat)
            return await self._unary(request, entry, gen, chat)
        try:
            resp = None
            if plan.hop == "decode":
                resp = await self.pd.acquire(request, plan, len(gen.prompts[0]), gen.stream)
                if plan.answered:  # the KV load failed inside an open stream
                    self.requests.set_status(entry, "errored")
                    return resp
            if gen.stream:
                return await self._stream(request, entry, gen, chat, plan, resp)
            return await self._unary(request, entry, gen, chat, plan)
        finally:
            self.pd.end(plan)

    def _submit(self, rid: str, prompt: list[int], max_tokens: int,
                lora: str | None, plan: PdPlan | None = None) -> tuple[int, Any]:
        rank = self.pick_rank()
        req = GenRequest(rid, prompt, max_tokens, lora)
        if plan is not None:
            req.hold_kv = plan.hop == "prefill"
            req.kv_ready_tokens = plan.kv_tokens
        try:
            handle = self.engines[rank].submit(req)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        self.active[rank] += 1
        return rank, handle

    def _submit_all(self, base_id: str, gen: Gen,
                    plan: PdPlan | None = None) -> list[tuple[str, int, Any]]:
        """Submit every prompt at once (they run concurrently, as in vLLM)."""
        subs: list[tuple[str, int, Any]] = []
        try:
            for i, prompt in enumerate(gen.prompts):
                rid = f"{base_id}-{i}"
                rank, handle = self._submit(rid, prompt, gen.max_tokens, gen.lora, plan)
                subs.append((rid, rank, handle))
                if plan is not None:  # a PD hop has one prompt
                    plan.rid, plan.handle = rid, handle
        except BaseException:
            self._release_all(subs)
            raise
        return subs

    def _release_all(self, subs: list[tuple[str, int, Any]]) -> None:
        for rid, rank, handle in subs:
            self.active[rank] -= 1
            if handle.finish_reason is None:  # client went away or we died: free its blocks
                self.engines[rank].abort(rid)

    async def _unary(self, request: web.Request, entry: dict[str, Any], gen: Gen,
                     chat: bool, plan: PdPlan | None = None) -> web.StreamResponse:
        base_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        die = self.faults.die_after_tokens
        choices, prompt_tokens, completion_tokens = [], 0, 0
        subs = self._submit_all(base_id, gen, plan)
        kv_params = None
        try:
            for i, (_rid, _rank, handle) in enumerate(subs):
                out: list[int] = []
                if die is None or entry["tokens_out"] < die:
                    async for tok in handle:
                        await self._token_faults(entry)
                        out.append(tok)
                        entry["tokens_out"] += 1
                        if die is not None and entry["tokens_out"] >= die:
                            break
                if die is not None and entry["tokens_out"] >= die:
                    return await self._die(request, entry)
                text = self.codec.gen_text(out)
                prompt_tokens += handle.prompt_len
                completion_tokens += len(out)
                reason = handle.finish_reason or "length"
                if chat:
                    choices.append({"index": i, "message": {
                        "role": "assistant", "content": text, "refusal": None,
                        "annotations": None, "audio": None, "function_call": None,
                        "tool_calls": [], "reasoning_content": None}, "logprobs": None,
                        "finish_reason": reason, "stop_reason": None})
                else:
                    choices.append({"index": i, "text": text, "logprobs": None,
                                    "finish_reason": reason, "stop_reason": None,
                                    "prompt_logprobs": None})
            if plan is not None and plan.hop == "prefill":
                kv_params = await self.pd.finish(plan, subs[0][2])
        finally:
            self._release_all(subs)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                 "completion_tokens": completion_tokens, "prompt_tokens_details": None}
        obj: dict[str, Any] = {"id": base_id, "object": "chat.completion" if chat
                               else "text_completion", "created": int(time.time()),
                               "model": gen.model, "choices": choices, "usage": usage}
        if chat:
            obj.update(service_tier=None, system_fingerprint=None, prompt_logprobs=None)
        obj["kv_transfer_params"] = kv_params
        self.requests.set_status(entry, "completed")
        return json_response(obj)

    async def _stream(self, request: web.Request, entry: dict[str, Any], gen: Gen,
                      chat: bool, plan: PdPlan | None = None,
                      resp: web.StreamResponse | None = None) -> web.StreamResponse:
        base_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        model_json = orjson.dumps(gen.model).decode()
        # every chunk is head + choice + tail, pre-encoded once per request
        head = (f'data: {{"id":"{base_id}","object":"'
                f'{"chat.completion.chunk" if chat else "text_completion"}",'
                f'"created":{created},"model":{model_json},"choices":[').encode()
        die = self.faults.die_after_tokens
        subs = self._submit_all(base_id, gen, plan)  # before the headers: a 400 is still possible
        codec = self.codec
        prompt_tokens = completion_tokens = 0
        try:
            if resp is None:
                resp = web.StreamResponse(headers=SSE_HEADERS)
                await resp.prepare(request)
            if die == 0:
                return await self._die(request, entry)
            for i, (_rid, _rank, handle) in enumerate(subs):
                if chat:
                    pre = head + b'{"index":%d,"delta":{"content":' % i
                    mid = b'},"logprobs":null,"finish_reason":null}]}\n\n'
                    last = b'},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
                    role = head + (b'{"index":%d,"delta":{"role":"assistant","content":""},'
                                   b'"logprobs":null,"finish_reason":null}]}\n\n' % i)
                else:
                    pre = head + b'{"index":%d,"text":' % i
                    mid = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
                    last = b',"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
                    role = b""
                n = 0
                sent_final = False
                if entry["tokens_out"] == 0:
                    await self._token_faults(entry)  # stall_after_tokens 0: headers, then nothing
                async for tok in handle:
                    if n or i:
                        await self._token_faults(entry)
                    n += 1
                    final = n == gen.max_tokens
                    chunk = pre + codec.gen_json(tok) + (last if final else mid)
                    if n == 1 and role:
                        chunk = role + chunk
                    await resp.write(chunk)
                    sent_final = final
                    entry["tokens_out"] += 1
                    if die is not None and entry["tokens_out"] >= die:
                        return await self._die(request, entry)
                if not sent_final:  # ended early (engine clamp or abort): close the choice
                    reason = orjson.dumps(handle.finish_reason or "length")
                    end = (b'{"index":%d,"delta":{"content":""},"logprobs":null,'
                           % i if chat else b'{"index":%d,"text":"","logprobs":null,' % i)
                    await resp.write(head + end + b'"finish_reason":' + reason +
                                     b',"stop_reason":null}]}\n\n')
                prompt_tokens += handle.prompt_len
                completion_tokens += n
            if plan is not None and plan.hop == "prefill":
                # vLLM's stream chunks carry no kv_transfer_params: the KV is kept unnamed
                failed = await self.pd.finish_stream(plan, subs[0][2])
                if failed:  # SGLang: the push to the decode failed
                    self.requests.set_status(entry, "errored")
                    await resp.write(failed + DONE)
                    await resp.write_eof()
                    return resp
        finally:
            self._release_all(subs)
        tail = b""
        if gen.include_usage:
            usage = {"prompt_tokens": prompt_tokens,
                     "total_tokens": prompt_tokens + completion_tokens,
                     "completion_tokens": completion_tokens}
            tail = head + b'],"usage":' + orjson.dumps(usage) + b"}\n\n"
        await resp.write(tail + DONE)
        self.requests.set_status(entry, "completed")
        await resp.write_eof()
        return resp

    # --- health, metrics, probes of other routers -----------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        self.polls["health"] += 1
        if self.faults.starting():
            return web.Response(status=503)
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        if self.faults.starting():
            return web.Response(status=503)
        rid = f"health-{uuid.uuid4().hex}"
        subs = [(rid, *self._submit(rid, [1, 2, 3], 1, None))]
        try:
            async for _ in subs[0][2]:
                pass
        finally:
            self._release_all(subs)
        return web.Response(status=200)

    def views(self) -> list[RankView]:
        return [RankView(i, e.snapshot()) for i, e in enumerate(self.engines)]

    async def metrics(self, request: web.Request) -> web.Response:
        self.polls["metrics"] += 1
        body = render(self.cfg.flavour, self.cfg.model, self.views(), self.cfg.max_loras)
        return web.Response(body=body, headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def state(self) -> dict[str, Any]:
        ranks = []
        for v in self.views():
            s = v.snap
            ranks.append({"rank": v.rank, "running": s.running, "waiting": s.waiting,
                          "kv_usage": s.kv_usage, "num_gpu_blocks": s.num_gpu_blocks,
                          "cached_free_blocks": s.cached_free_blocks,
                          "cached_blocks": getattr(s, "cached_blocks", 0),
                          "prefix_queries_total": s.prefix_queries_total,
                          "prefix_hits_total": s.prefix_hits_total,
                          "preemptions_total": s.preemptions_total,
                          "lora_loads_total": getattr(s, "lora_loads_total", 0),
                          "requests_finished_total": s.requests_finished_total,
                          "lag_seconds": s.lag_seconds, "lag_max_seconds": s.lag_max_seconds,
                          "steps_total": s.steps_total, "busy_fraction": s.busy_fraction})

        def total(k: str) -> float:
            return sum(r[k] for r in ranks)

        return {"index": self.cfg.index, "port": self.cfg.port,
                "running": total("running"), "waiting": total("waiting"),
                "kv_usage": total("kv_usage") / len(ranks),
                "cached_free_blocks": total("cached_free_blocks"),
                "lag_seconds": max(r["lag_seconds"] for r in ranks),
                "lag_max_seconds": max(r["lag_max_seconds"] for r in ranks),
                "loras": list(self.loras), "ranks": ranks, "polls": dict(self.polls),
                "pd": self.pd.state() if self.pd is not None else None}

    def summary(self) -> dict[str, Any]:
        return {"index": self.cfg.index, "port": self.cfg.port, "host": self.cfg.host,
                "model": self.cfg.model, "flavour": self.cfg.flavour, "fast": self.cfg.fast,
                "dp_ranks": len(self.engines), "loras": list(self.loras),
                "listening": self._site is not None,
                "role": self.pd.s.role if self.pd is not None else "both",
                "kv_port": self.pd.port if self.pd is not None else None}
