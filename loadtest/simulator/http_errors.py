"""OpenAI-style error answers (vLLM's shape), JSON responses, SSE response headers."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"


class ApiError(Exception):
    """An OpenAI-style error answer (vLLM's shape: {"error": {...}})."""

    def __init__(self, status: int, message: str, type_: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _ERROR_TYPES.get(status, "BadRequestError")
        self.param = param

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.type, self.param)


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                502: "BadGatewayError", 503: "ServiceUnavailableError", 504: "GatewayTimeout"}


def error_response(status: int, message: str, type_: str | None = None,
                   param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_ or _ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON)


def stream_flag(body: dict[str, Any]) -> bool:
    """The request's `stream` (absent or null: False); 400 if not a boolean."""
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    return stream


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type=JSON)
