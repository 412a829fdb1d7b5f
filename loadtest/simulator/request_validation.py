"""Validation of a generation request (chat, completions) as vLLM does it: a mixin of
EngineServer (it uses its cfg, codec and served()), kept apart so that server.py stays
about serving."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from .http_errors import ApiError, stream_flag
from .probes import DEFAULT_MAX_TOKENS
from .tokenizer import ChatTemplateError, render_chat

LONG_TEXT_CHARS = 8192


@dataclass
class Gen:
    """A validated generation request."""

    prompts: list[list[int]]
    max_tokens: int
    stream: bool
    include_usage: bool
    lora: str | None
    model: str



class RequestValidation:
    cfg: Any
    codec: Any

    def served(self, model: Any) -> tuple[str, str | None]:
        raise NotImplementedError

    @staticmethod
    async def read_json(request: web.Request) -> dict[str, Any]:
        try:
            raw = await request.read()
        except (RequestPayloadError, HttpProcessingError) as e:  # e.g. an undecodable Content-Encoding
            raise ApiError(400, f"Cannot read the request body: {getattr(e, 'message', e)}") from None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise ApiError(400, f"Invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object")
        return body

    async def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # the tokenizer releases the GIL: long prompts go to a thread so that the engines'
        # step loops in this process are not held up (about 1.5 us per token)
        if len(text) < LONG_TEXT_CHARS:
            return self.codec.encode(text, add_special_tokens)
        return await asyncio.to_thread(self.codec.encode, text, add_special_tokens)

    async def _validate(self, body: dict[str, Any], chat: bool) -> Gen:
        model, lora = self.served(body.get("model"))
        n = body.get("n", 1)
        if n is not None and n != 1:
            raise ApiError(400, "Only n=1 is supported by the simulator.", param="n")
        stream = stream_flag(body)
        opts = body.get("stream_options")
        include_usage = False
        if opts is not None:
            if not stream:
                raise ApiError(400, "Stream options can only be defined when `stream=True`.",
                               param="stream_options")
            if not isinstance(opts, dict):
                raise ApiError(400, "'stream_options' must be an object", param="stream_options")
            include_usage = opts.get("include_usage") is True
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, "max_tokens must be an integer of at least 1", param="max_tokens")
        if chat:
            try:
                text = render_chat(body.get("messages"),
                                   body.get("add_generation_prompt", True) is not False)
            except ChatTemplateError as e:
                raise ApiError(400, str(e), param="messages") from None
            prompts = [await self._encode(text, False)]
        else:
            prompts = [p if isinstance(p, list) else await self._encode(p, True)
                       for p in self._prompts(body.get("prompt"))]
        for p in prompts:
            if len(p) + max_tokens > self.cfg.max_model_len:
                raise ApiError(
                    400, f"This model's maximum context length is {self.cfg.max_model_len} "
                    f"tokens. However, you requested {len(p) + max_tokens} tokens "
                    f"({len(p)} in the messages, {max_tokens} in the completion). "
                    "Please reduce the length of the messages or completion.", param="messages")
        return Gen(prompts, max_tokens, stream, include_usage, lora, model)

    def _prompts(self, prompt: Any) -> list[list[int] | str]:
        """A string, a list of strings, a list of token ids, or a list of such lists
        -> texts (still to encode, with BOS) and token-id lists."""
        def ids_ok(x: Any) -> bool:
            return bool(x) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                   for t in x)

        if isinstance(prompt, str) and prompt:
            return [prompt]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) and p for p in prompt):
                return list(prompt)
            if ids_ok(prompt):
                return [list(prompt)]
            if all(isinstance(p, list) and ids_ok(p) for p in prompt):
                return [list(p) for p in prompt]
        raise ApiError(400, "'prompt' must be a non-empty string, list of strings, list of "
                       "token ids or list of token-id lists", param="prompt")
