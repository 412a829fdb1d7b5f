"""Endpoints that routers probe besides inference: SGLang's server/model info and load,
cache flush, and vLLM's tokenizer endpoints (/tokenize, /detokenize, the render calls that
vllm-router's cache-aware policy makes for every request).

A mixin of EngineServer (it uses its cfg, codec, engines, views(), served(), read_json(),
_encode() and _prompts()).
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from .http_errors import ApiError, json_response
from .tokenizer import ChatTemplateError, render_chat

DEFAULT_MAX_TOKENS = 16


class ProbeEndpoints:
    async def server_info(self, request: web.Request) -> web.Response:
        snaps = [v.snap for v in self.views()]
        return json_response({
            "model_path": self.cfg.model, "served_model_name": self.cfg.model,
            "tokenizer_path": self.cfg.model, "host": self.cfg.host, "port": self.cfg.port,
            "dp_size": len(self.engines), "tp_size": 1, "page_size": self.cfg.block_size,
            "max_running_requests": self.cfg.max_num_seqs,
            "chunked_prefill_size": self.cfg.max_num_batched_tokens,
            "context_length": self.cfg.max_model_len, "max_loras_per_batch": self.cfg.max_loras,
            "max_total_num_tokens": sum(s.num_gpu_blocks for s in snaps) * self.cfg.block_size,
            "disaggregation_mode": "null" if self.pd is None else self.pd.s.role,
            "disaggregation_bootstrap_port": (self.pd.port if self.pd is not None
                                              and self.pd.port else 8998),
            "version": "0.4.9-simulated",
            "internal_states": [{"dp_rank": i, "num_running_reqs": s.running,
                                 "num_queue_reqs": s.waiting, "token_usage": s.kv_usage}
                                for i, s in enumerate(snaps)],
        })

    async def model_info(self, request: web.Request) -> web.Response:
        return json_response({
            "model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "llama",
            "architectures": ["LlamaForCausalLM"]})

    async def get_load(self, request: web.Request) -> web.Response:
        # {"load": N} is what sglang-router / vllm-router read; per-rank detail beside it
        snaps = [v.snap for v in self.views()]
        per_rank = [{"dp_rank": i, "num_reqs": s.running + s.waiting,
                     "num_waiting_reqs": s.waiting,
                     "num_tokens": round(s.kv_usage * s.num_gpu_blocks * self.cfg.block_size)}
                    for i, s in enumerate(snaps)]
        return json_response({"load": sum(r["num_reqs"] for r in per_rank),
                              "server_load": sum(r["num_reqs"] for r in per_rank),
                              "ranks": per_rank})

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = all(e.reset_prefix_cache() for e in self.engines
                 if hasattr(e, "reset_prefix_cache"))
        if ok:
            return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                "(When there are running or waiting requests, the operation "
                                "will not be performed.)\n")
        return web.Response(status=400, text="Cache not flushed: requests are running.\n")

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": "0.0.0-simulator"})

    # --- tokenizer endpoints --------------------------------------------------------------
    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        self.served(body.get("model"))
        if "messages" in body:
            try:
                text = render_chat(body["messages"],
                                   body.get("add_generation_prompt", True) is not False)
            except ChatTemplateError as e:
                raise ApiError(400, str(e), param="messages") from None
            ids = await self._encode(text, body.get("add_special_tokens", False) is True)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise ApiError(400, "'prompt' (a string) or 'messages' is required",
                               param="prompt")
            ids = await self._encode(prompt, body.get("add_special_tokens", True) is not False)
        strs = self.codec.token_strs(ids) if body.get("return_token_strs") else None
        return json_response({"count": len(ids), "max_model_len": self.cfg.max_model_len,
                              "tokens": ids, "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        self.served(body.get("model"))
        tokens = body.get("tokens")
        vocab = self.codec.vocab_size
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
            raise ApiError(400, f"'tokens' must be a list of token ids in [0, {vocab})",
                           param="tokens")
        text = self.codec.tokenizer.decode(tokens, skip_special_tokens=False)
        return json_response({"prompt": text})

    def _render_one(self, rid: str, ids: list[int], body: dict[str, Any],
                    model: str) -> dict[str, Any]:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        return {"request_id": rid, "token_ids": ids, "features": None,
                "sampling_params": {"max_tokens": max_tokens or DEFAULT_MAX_TOKENS},
                "model": model, "stream": body.get("stream") is True, "cache_salt": None,
                "priority": 0, "kv_transfer_params": None}

    async def render_chat(self, request: web.Request) -> web.Response:
        """vLLM's /v1/chat/completions/render: the prompt token ids, no generation."""
        body = await self.read_json(request)
        model, _ = self.served(body.get("model"))
        try:
            text = render_chat(body.get("messages"),
                               body.get("add_generation_prompt", True) is not False)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages") from None
        return json_response(self._render_one("chatcmpl-" + uuid.uuid4().hex,
                                              await self._encode(text, False), body, model))

    async def render_completions(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        model, _ = self.served(body.get("model"))
        prompts = [p if isinstance(p, list) else await self._encode(p, True)
                   for p in self._prompts(body.get("prompt"))]
        rid = "cmpl-" + uuid.uuid4().hex
        return json_response([self._render_one(f"{rid}-{i}", p, body, model)
                              for i, p in enumerate(prompts)])
