"""The inference paths the router proxies (an allow-list) and what each one needs.

The OpenAI-compatible paths that vLLM and SGLang serve under /v1. Engine management
(LoRA loading, cache flush, profiling, ...) and anything unknown answer an OpenAI-style
404, so a client cannot reach an engine's admin surface through the router.

`/v1/responses/{id}` (GET) and `/v1/responses/{id}/cancel` (POST) carry no model: they go
to the engine that stored the response (see response_ids.py).

Multipart bodies (/v1/audio/transcriptions, /v1/audio/translations) are refused with 415:
the router routes by the JSON body's `model`, and finding it in a multipart upload would
mean buffering or parsing uploads of many megabytes on the hot path. See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from kthena_router.errors import RequestError
from kthena_router.proxy.sse import StreamEnd

RESPONSES_PATH = "/v1/responses"
_RESPONSES_PREFIX = "/v1/responses/"


@dataclass(frozen=True, slots=True)
class ApiPath:
    label: str                 # bounded "path" metric label
    stream_end: StreamEnd      # how a streamed answer ends
    multipart: bool = False    # a multipart/form-data API (refused, see above)
    response_id: str = ""      # GET /v1/responses/{id} or its cancel: routed by this id
    method: str = "POST"


_JSON_APIS = {
    "/v1/chat/completions": StreamEnd.DONE,
    "/v1/completions": StreamEnd.DONE,
    "/v1/responses": StreamEnd.RESPONSES,
    "/v1/messages": StreamEnd.MESSAGES,  # Anthropic Messages API (vLLM serves it; external providers)
    "/v1/embeddings": StreamEnd.EOF,
    "/v1/score": StreamEnd.EOF,
    "/v1/rerank": StreamEnd.EOF,
    "/v1/classify": StreamEnd.EOF,
    "/v1/pooling": StreamEnd.EOF,
    "/v1/tokenize": StreamEnd.EOF,
    "/v1/detokenize": StreamEnd.EOF,
    "/v1/chat/completions/render": StreamEnd.EOF,
    "/v1/completions/render": StreamEnd.EOF,
}
_MULTIPART_APIS = ("/v1/audio/transcriptions", "/v1/audio/translations")

_TABLE: dict[str, ApiPath] = {p: ApiPath(p, end) for p, end in _JSON_APIS.items()}
_TABLE.update({p: ApiPath(p, StreamEnd.DONE, multipart=True) for p in _MULTIPART_APIS})
_BY_ID_LABEL = "/v1/responses/{id}"

LABELS = frozenset(a.label for a in _TABLE.values()) | {_BY_ID_LABEL}


def resolve(method: str, path: str) -> ApiPath:
    """The API of a proxied request; RequestError (404/405/415) for anything else."""
    api = _TABLE.get(path)
    if api is None and path.startswith(_RESPONSES_PREFIX):
        api = _by_id(method, path[len(_RESPONSES_PREFIX):])
    if api is None:
        raise RequestError(404, f"no such endpoint: {method} {path}")
    if method != api.method:
        raise RequestError(405, f"method {method} is not allowed on {path}")
    if api.multipart:
        # 415, not 501: the router refuses the media type (a client-side choice), it is not
        # failing; every 5xx stays an upstream or router fault.
        raise RequestError(415, f"{path} (multipart/form-data uploads) is not supported by this router; "
                                "send it to the engine directly")
    return api


def label_of(method: str, path: str, other: str) -> str:
    """The "path" metric label of a request not yet resolved (`other` for unknown paths)."""
    try:
        return resolve(method, path).label
    except RequestError:
        return other


def _by_id(method: str, rest: str) -> ApiPath | None:
    cancel = rest.endswith("/cancel")
    rid = rest[:-len("/cancel")] if cancel else rest
    if not rid or "/" in rid:
        return None
    return ApiPath(_BY_ID_LABEL, StreamEnd.EOF, response_id=rid, method="POST" if cancel else "GET")


_SAFE_PATH = "/:@!$&'()*+,;=-._~%"
_SAFE_QUERY = _SAFE_PATH + "?"
_LINES = {p: b"POST " + p.encode() + b" HTTP/1.1\r\n" for p in _TABLE}


def request_line(method: str, path: str, query: bytes) -> bytes:
    """b"<METHOD> <target>[?query] HTTP/1.1\\r\\n" for the (decoded) ASGI path and raw query."""
    if not query and method == "POST":
        line = _LINES.get(path)
        if line is not None:
            return line
    target = quote(path, safe=_SAFE_PATH).encode("ascii")
    if query:
        target += b"?" + quote(query, safe=_SAFE_QUERY).encode("ascii")
    return method.encode("ascii") + b" " + target + b" HTTP/1.1\r\n"
