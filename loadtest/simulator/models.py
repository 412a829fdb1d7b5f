"""/v1/models and vLLM's runtime LoRA loading (/v1/load_lora_adapter, /v1/unload_lora_adapter).

A mixin of EngineServer (it uses its cfg, created, faults, loras, read_json() and
_starting_error()).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .http_errors import ApiError, json_response


class ModelEndpoints:
    async def models(self, request: web.Request) -> web.Response:
        if self.faults.starting():
            raise self._starting_error()

        def card(mid: str, root: str, parent: str | None) -> dict[str, Any]:
            return {"id": mid, "object": "model", "created": self.created, "owned_by": "vllm",
                    "root": root, "parent": parent, "max_model_len": self.cfg.max_model_len,
                    "permission": [{"id": f"modelperm-{mid}", "object": "model_permission",
                                    "created": self.created, "allow_create_engine": False,
                                    "allow_sampling": True, "allow_logprobs": True,
                                    "allow_search_indices": False, "allow_view": True,
                                    "allow_fine_tuning": False, "organization": "*",
                                    "group": None, "is_blocking": False}]}

        data = [card(self.cfg.model, self.cfg.model, None)]
        data += [card(name, path, self.cfg.model) for name, path in self.loras.items()]
        return json_response({"object": "list", "data": data})

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                           param="lora_name")
        if name in self.loras or name == self.cfg.model:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.",
                           param="lora_name")
        limit = self.cfg.max_cpu_loras or self.cfg.max_loras
        if len(self.loras) >= limit:
            raise ApiError(400, f"Cannot load LoRA adapter '{name}': max_loras="
                           f"{limit} adapters are already loaded.",
                           param="lora_name")
        self.loras[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'lora_name' must be provided.", param="lora_name")
        if name not in self.loras:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError",
                           "lora_name")
        del self.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
