"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}.

Shape and type names follow vLLM (``type`` names the error class, ``code`` is the HTTP
status), so clients that handle vLLM's errors handle ours. Router-made messages never
name a backend address.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import orjson
from starlette.responses import Response

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# type names per status (vLLM/OpenAI style)
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    499: "ClientClosedRequest",
    500: "InternalServerError",
    502: "upstream_error",
    503: "ServiceUnavailableError",
    504: "upstream_timeout",
}


class RequestError(Exception):
    """A request the router refuses; carries everything the error body needs."""

    def __init__(self, status: int, message: str, type_: str | None = None, param: str | None = None,
                 code: int | str | None = None, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.headers = list(headers)  # extra response headers: WWW-Authenticate, Retry-After, x-ratelimit-*
        self.status = status
        self.message = message
        self.type = type_ or ERROR_TYPES.get(status, "error")
        self.param = param
        self.code = code if code is not None else status


def error_payload(status: int, message: str, type_: str | None = None, param: str | None = None,
                  code: int | str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_ or ERROR_TYPES.get(status, "error"),
                      "param": param, "code": code if code is not None else status}}


def error_body(status: int, message: str, type_: str | None = None, param: str | None = None,
               code: int | str | None = None) -> bytes:
    return orjson.dumps(error_payload(status, message, type_, param, code))


def error_response(status: int, message: str, type_: str | None = None, param: str | None = None,
                   code: int | str | None = None) -> Response:
    """Starlette response (for the non-hot routes)."""
    return Response(error_body(status, message, type_, param, code), status_code=status,
                    media_type="application/json")


async def send_error(send: Send, err: RequestError, extra_headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Write a complete JSON error response on a raw ASGI `send`."""
    body = error_body(err.status, err.message, err.type, err.param, err.code)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.extend(err.headers)
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def sse_error_event(message: str, type_: str = "upstream_error", code: int = 502) -> bytes:
    """The event that ends a stream that failed after bytes reached the client (no [DONE])."""
    return b"data: " + orjson.dumps(error_payload(code, message, type_, None, code)) + b"\n\n"


def messages_error_event(message: str) -> bytes:
    """The same for an Anthropic Messages stream, in its protocol (an `error` event)."""
    return b"event: error\ndata: " + orjson.dumps(
        {"type": "error", "error": {"type": "api_error", "message": message}}) + b"\n\n"
