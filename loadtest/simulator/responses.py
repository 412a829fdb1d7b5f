"""vLLM's /v1/responses (OpenAI Responses API), text only: create (streamed or not),
GET by id, and `previous_response_id` continuation from this engine's own store.

Streamed answers are SSE events `event: <type>` + `data: <json>` with a sequence
number, ending with `response.completed`, `response.incomplete` (max_output_tokens hit)
or `response.failed`, and no `data: [DONE]` (as vLLM). The store is per engine port and
bounded (oldest dropped first), so a continuation on another engine gets a 404, as a
real vLLM replica would.

A mixin of EngineServer (it uses its codec, faults, requests, served(), _encode(),
_submit_all(), _release_all() and _die()).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from .http_errors import SSE_HEADERS, ApiError, json_response, stream_flag
from .probes import DEFAULT_MAX_TOKENS
from .tokenizer import ChatTemplateError, render_chat

STORE_LIMIT = 1024


@dataclass
class _Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation up to and including this answer


class ResponseStore:
    """Responses kept for GET and continuation; the oldest go first past `limit`."""

    def __init__(self, limit: int = STORE_LIMIT) -> None:
        self.limit = limit
        self._items: OrderedDict[str, _Stored] = OrderedDict()

    def get(self, response_id: str) -> _Stored | None:
        return self._items.get(response_id)

    def put(self, response_id: str, item: _Stored) -> None:
        self._items[response_id] = item
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def _not_found(response_id: str, param: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", param)


def _input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    value = body.get("input")
    if isinstance(value, str) and value:
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value:
        out = []
        for item in value:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise ApiError(400, "each input item must be a message object with a string 'role'",
                               param="input")
            content = item.get("content")
            if isinstance(content, list):  # input_text parts -> text parts for the template
                content = [{"type": "text", "text": p.get("text")} for p in content
                           if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")]
            out.append({"role": item["role"], "content": content})
        return out
    raise ApiError(400, "'input' must be a non-empty string or a non-empty list of messages", param="input")


class ResponsesEndpoints:
    store: ResponseStore

    async def get_response(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        item = self.store.get(response_id)
        if item is None:
            raise _not_found(response_id, "response_id")
        return json_response(item.response)

    async def serve_response(self, request: web.Request, entry: dict[str, Any],
                             body: dict[str, Any]) -> web.StreamResponse:
        model, lora = self.served(body.get("model"))
        stream = stream_flag(body)
        limit = body.get("max_output_tokens")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ApiError(400, "max_output_tokens must be an integer of at least 1", param="max_output_tokens")
        history: list[dict[str, Any]] = []
        prev_id = body.get("previous_response_id")
        if prev_id is not None:
            prev = self.store.get(prev_id) if isinstance(prev_id, str) else None
            if prev is None:
                raise _not_found(str(prev_id), "previous_response_id")
            history = list(prev.messages)
        messages = history + _input_messages(body)
        instructions = body.get("instructions")
        template = ([{"role": "system", "content": instructions}] if isinstance(instructions, str) else []) \
            + messages
        try:
            prompt = await self._encode(render_chat(template), False)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="input") from None
        max_tokens = limit if limit is not None else DEFAULT_MAX_TOKENS
        resp_id = "resp_" + uuid.uuid4().hex
        msg_id = "msg_" + uuid.uuid4().hex
        base = {"id": resp_id, "object": "response", "created_at": int(time.time()), "model": model,
                "instructions": instructions, "max_output_tokens": limit, "previous_response_id": prev_id,
                "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                "incomplete_details": None, "error": None, "usage": None, "status": "in_progress"}
        gen = _Generation(self, entry, resp_id, msg_id, prompt, max_tokens, lora, limit is not None)
        entry["http_status"] = 200
        if stream:
            return await gen.stream(request, base, messages, body.get("store", True) is not False)
        final = await gen.run(None)
        if final is None:
            return await self._die(request, entry)
        obj = gen.finish(base, final)
        if body.get("store", True) is not False:
            self.store.put(resp_id, _Stored(obj, messages + [{"role": "assistant", "content": final}]))
        self.requests.set_status(entry, "completed")
        return json_response(obj)


class _Generation:
    """One generation behind a response; `run` feeds text deltas to an optional writer."""

    def __init__(self, server: Any, entry: dict[str, Any], resp_id: str, msg_id: str, prompt: list[int],
                 max_tokens: int, lora: str | None, limited: bool) -> None:
        self.server = server
        self.entry = entry
        self.resp_id = resp_id
        self.msg_id = msg_id
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.lora = lora
        self.limited = limited  # the client set max_output_tokens: reaching it is "incomplete"
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.reason = "length"
        self.seq = 0

    async def run(self, resp: web.StreamResponse | None) -> str | None:
        """The generated text; None when the die_after_tokens fault fired."""
        server = self.server
        die = server.faults.die_after_tokens
        subs = server._submit_all(self.resp_id, _One(self.prompt, self.max_tokens, self.lora))
        pieces: list[str] = []
        try:
            _rid, _rank, handle = subs[0]
            async for tok in handle:
                piece = server.codec.gen_text([tok])
                pieces.append(piece)
                self.output_tokens += 1
                self.entry["tokens_out"] += 1
                if resp is not None:
                    await resp.write(self.event("response.output_text.delta", item_id=self.msg_id,
                                                output_index=0, content_index=0, delta=piece, logprobs=[]))
                if die is not None and self.entry["tokens_out"] >= die:
                    return None
            self.prompt_tokens = handle.prompt_len
            self.reason = handle.finish_reason or "length"
        finally:
            server._release_all(subs)
        return "".join(pieces)

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def status(self) -> str:
        if self.reason == "abort":
            return "failed"
        if self.reason == "length" and self.limited:
            return "incomplete"
        return "completed"

    def message(self, text: str, status: str) -> dict[str, Any]:
        return {"id": self.msg_id, "type": "message", "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    def finish(self, base: dict[str, Any], text: str) -> dict[str, Any]:
        status = self.status()
        obj = dict(base, status=status, output=[self.message(text, "completed" if status == "completed"
                                                             else "incomplete")])
        obj["usage"] = {"input_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                        "total_tokens": self.prompt_tokens + self.output_tokens,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 0}}
        if status == "incomplete":
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        elif status == "failed":
            obj["error"] = {"code": "server_error", "message": "generation aborted"}
        return obj

    async def stream(self, request: web.Request, base: dict[str, Any], messages: list[dict[str, Any]],
                     store: bool) -> web.StreamResponse:
        server = self.server
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(self.event("response.created", response=base)
                         + self.event("response.in_progress", response=base)
                         + self.event("response.output_item.added", output_index=0,
                                      item=self.message("", "in_progress") | {"content": []})
                         + self.event("response.content_part.added", item_id=self.msg_id, output_index=0,
                                      content_index=0, part={"type": "output_text", "text": "",
                                                             "annotations": [], "logprobs": []}))
        if server.faults.die_after_tokens == 0:
            return await server._die(request, self.entry)
        text = await self.run(resp)
        if text is None:
            return await server._die(request, self.entry)
        obj = self.finish(base, text)
        part = obj["output"][0]["content"][0]
        tail = (self.event("response.output_text.done", item_id=self.msg_id, output_index=0, content_index=0,
                           text=text, logprobs=[])
                + self.event("response.content_part.done", item_id=self.msg_id, output_index=0,
                             content_index=0, part=part)
                + self.event("response.output_item.done", output_index=0, item=obj["output"][0])
                + self.event(f"response.{obj['status']}", response=obj))
        if store:
            server.store.put(self.resp_id, _Stored(obj, messages + [{"role": "assistant", "content": text}]))
        await resp.write(tail)
        server.requests.set_status(self.entry, "completed")
        await resp.write_eof()
        return resp


@dataclass
class _One:
    """The fields _submit_all reads from a generation request (one prompt)."""

    prompt: list[int]
    max_tokens: int
    lora: str | None

    @property
    def prompts(self) -> list[list[int]]:
        return [self.prompt]
