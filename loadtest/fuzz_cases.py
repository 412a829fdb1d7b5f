"""Generated requests for the fuzz driver (loadtest/fuzz_router.py): each a `Case` holding
the exact bytes to send, built by hypothesis strategies (shared ones in fuzz_strategies).

Families (`Case.kind`):
  strict ones (well-formed HTTP/1.1: a reply is required, errors are OpenAI-style JSON):
    valid, stream, wrong_field, garbage_json, unknown_model, odd_prompt, method, headers,
    chunked, large, oversized;
  loose ones (broken framing or request lines: the HTTP layer may refuse them its own way
  or close; still never a 5xx, a leak or a hang): truncated, bad_chunked, bad_framing, wire;
  abort: a valid request whose client goes away while the reply arrives.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from .fuzz_strategies import (
    CHAT,
    COMPL,
    garbage_bodies,
    json_values,
    odd_messages,
    odd_prompts,
    odd_text,
    odd_unknown_fields,
    unknown_models,
    wire_header_lines,
    wire_methods,
    wire_paths,
    wire_versions,
    wrong_field,
)

MAX_BODY_BYTES = 65536  # the router under test runs with --max-body-bytes this
# The router's forwarded /v1/* paths (and some it does not know), /v1/models (GET only).
PATHS = [CHAT, COMPL, "/v1/embeddings", "/v1/responses", "/v1/score", "/v1/rerank", "/v1/tokenize",
         "/v1/detokenize", "/v1/audio/transcriptions", "/v1/chat/completions/render", "/v1/models",
         "/v1/made-up", "/v1/load_lora_adapter"]
QUERIES = ["", "", "", "?x=1", "?a=%ff&b", "?" + "q" * 300]
MODELS = ["demo", "demo", "demo-lora-a", "demo-lora-b"]
RID_MARK = b"\x00RID\x00"  # replaced by the request's x-request-id header line when sent


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    raw: bytes  # with RID_MARK where the x-request-id header line goes (strict cases)
    method: str  # "HEAD" for HEAD requests (no response body), else anything
    strict: bool
    follow_up: int = 0  # then a valid request on the same connection: 1 after the reply, 2 pipelined
    abort_after: int = 0  # > 0: close the connection after this many reply bytes (client gone)

    def wire(self, rid: str) -> bytes:
        return self.raw.replace(RID_MARK, f"x-request-id: {rid}\r\n".encode(), 1)


def http_request(method: bytes, target: bytes, body: bytes | None, headers: list[tuple[bytes, bytes]] = (),
                 *, ctype: bytes | None = b"application/json", chunks: list[bytes] | None = None) -> bytes:
    head = [method + b" " + target + b" HTTP/1.1\r\nhost: x\r\n"]
    if ctype is not None:
        head.append(b"content-type: " + ctype + b"\r\n")
    head.extend(k + b": " + v + b"\r\n" for k, v in headers)
    head.append(RID_MARK)
    if chunks is not None:
        head.append(b"transfer-encoding: chunked\r\n\r\n")
        return b"".join(head) + b"".join(chunks)
    body = body or b""
    if body or method not in (b"GET", b"HEAD"):
        head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
    return b"".join(head) + b"\r\n" + body


def valid_body(path: str, model: str = "demo", max_tokens: int = 1, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hello"
    if stream:
        body["stream"] = True
    return body


def dumps(v: Any) -> bytes:
    return json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")


VALID = dumps(valid_body(COMPL))
FOLLOW = st.sampled_from([0, 0, 1, 2])
inference_paths = st.sampled_from([CHAT, COMPL])
targets = st.builds(lambda p, q: (p + q).encode(), st.sampled_from(PATHS), st.sampled_from(QUERIES))
tokens = st.text(string.ascii_letters + string.digits + "-!#$%&'*+.^_`|~", min_size=1, max_size=16)
# visible ASCII, space, tab and obs-text: legal in a header value
header_values = st.binary(max_size=60).map(lambda b: bytes(c for c in b if c == 9 or 32 <= c != 127))
SPECIAL_HEADERS = st.sampled_from([
    (b"accept-encoding", b"gzip, br"), (b"accept-encoding", b"identity"), (b"connection", b"keep-alive"),
    (b"connection", b"x-hop, keep-alive"), (b"x-hop", b"1"), (b"connection", b"upgrade"),
    (b"upgrade", b"websocket"), (b"expect", b"100-continue"), (b"te", b"trailers"),
    (b"content-encoding", b"gzip"), (b"authorization", b"Bearer sk-secret"), (b"cookie", b"a=b"),
    (b"content-type", b"text/plain"), (b"content-type", b"multipart/form-data; boundary=x"),
    (b"accept", b"text/event-stream"), (b"x-forwarded-for", b"10.0.0.1"), (b"forwarded", b"for=x"),
    (b"proxy-authorization", b"Basic eA=="), (b"keep-alive", b"timeout=1"), (b"x-long", b"v" * 7000),
    (b"host", b"other:1"), (b"x-user-tier", b"beta"), (b"x-request-id", b""), (b"x-request-id", b"\xff\xfe id"),
    (b"x-request-id", b"r" * 5000), (b"content-length", b"0"), (b"transfer-encoding", b"identity"),
])


@st.composite
def valid_case(draw: st.DrawFn) -> Case:
    path = draw(inference_paths)
    stream = draw(st.booleans())
    body = valid_body(path, draw(st.sampled_from(MODELS)), draw(st.integers(1, 4)), stream)
    if stream and draw(st.booleans()):
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    text = draw(odd_text)
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body.update(draw(odd_unknown_fields))
    return Case("stream" if stream else "valid", http_request(b"POST", path.encode(), dumps(body)), "POST",
                True, draw(FOLLOW))


@st.composite
def wrong_field_case(draw: st.DrawFn) -> Case:
    field, value, path = draw(wrong_field)
    body = valid_body(path)
    body[field] = value
    return Case("wrong_field", http_request(b"POST", path.encode(), dumps(body)), "POST", True, draw(FOLLOW))


@st.composite
def garbage_case(draw: st.DrawFn) -> Case:
    raw = draw(garbage_bodies | json_values.filter(lambda v: not isinstance(v, dict)).map(dumps))
    return Case("garbage_json", http_request(b"POST", draw(targets), raw), "POST", True, draw(FOLLOW))


@st.composite
def unknown_model_case(draw: st.DrawFn) -> Case:
    path = draw(inference_paths)
    body = valid_body(path, draw(unknown_models), stream=draw(st.booleans()))
    return Case("unknown_model", http_request(b"POST", path.encode(), dumps(body)), "POST", True, draw(FOLLOW))


@st.composite
def odd_prompt_case(draw: st.DrawFn) -> Case:
    path = draw(inference_paths)
    body: dict[str, Any] = {"model": "demo", "max_tokens": 1}
    if path == CHAT:
        body["messages"] = draw(odd_messages)
        if draw(st.booleans()):
            body["tools"] = draw(json_values)
    else:
        prompt = draw(odd_prompts)
        body["prompt"] = prompt if isinstance(prompt, (str, list)) else [prompt]
    return Case("odd_prompt", http_request(b"POST", path.encode(), dumps(body)), "POST", True, draw(FOLLOW))


@st.composite
def method_case(draw: st.DrawFn) -> Case:
    method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "FOO",
                                   "M-SEARCH", "post", "POST"]))
    body = draw(st.sampled_from([b"", VALID]))
    raw = http_request(method.encode(), draw(targets), body)
    return Case("method", raw, method, True, draw(FOLLOW))


@st.composite
def headers_case(draw: st.DrawFn) -> Case:
    path = draw(inference_paths)
    extra = draw(st.lists(SPECIAL_HEADERS | st.tuples(tokens.map(str.encode), header_values), max_size=4))
    ctype = draw(st.sampled_from([b"application/json", b"application/json; charset=utf-8", b"APPLICATION/JSON",
                                  b"text/plain", b"", None]))
    body = dumps(valid_body(path, stream=draw(st.booleans())))
    raw = http_request(b"POST", path.encode(), body, extra, ctype=ctype)
    if any(k in (b"content-length", b"transfer-encoding") for k, _ in extra):  # conflicting framing
        return Case("bad_framing", raw, "POST", False)
    return Case("headers", raw, "POST", True, draw(FOLLOW))


def _chunked(body: bytes, sizes: list[int], ext: bool, trailer: bool) -> list[bytes]:
    out, i = [], 0
    for n in sizes:
        if i >= len(body):
            break
        part = body[i:i + n]
        i += len(part)
        out.append(b"%x%s\r\n%s\r\n" % (len(part), b";x=y" if ext else b"", part))
    if i < len(body):
        out.append(b"%x\r\n%s\r\n" % (len(body) - i, body[i:]))
    out.append(b"0\r\n" + (b"x-trailer: 1\r\n" if trailer else b"") + b"\r\n")
    return out


@st.composite
def chunked_case(draw: st.DrawFn) -> Case:
    path = draw(inference_paths)
    body = draw(st.sampled_from([dumps(valid_body(path, stream=draw(st.booleans())))]) | garbage_bodies)
    chunks = _chunked(body, draw(st.lists(st.integers(1, 64), max_size=8)), draw(st.booleans()),
                      draw(st.booleans()))
    if not draw(st.integers(0, 3)):  # broken framing: the HTTP layer decides
        i = draw(st.integers(0, len(chunks) - 1))
        chunks[i] = draw(st.sampled_from([b"zz\r\n", b"5\r\nab\r\n", b"-1\r\n", b"ffffffffffffffffff\r\n",
                                          chunks[i].replace(b"\r\n", b"\n"), chunks[i][:-2]]))
        return Case("bad_chunked", http_request(b"POST", path.encode(), None, chunks=chunks), "POST", False)
    return Case("chunked", http_request(b"POST", path.encode(), None, chunks=chunks), "POST", True,
                draw(FOLLOW))


@st.composite
def large_case(draw: st.DrawFn) -> Case:
    """A long prompt (the prefix index hashes it) around the body limit: served, or 413."""
    path = draw(inference_paths)
    body = valid_body(path, stream=draw(st.booleans()))
    text = draw(st.sampled_from(["p", "é", "ab\u0000"])) * draw(st.integers(MAX_BODY_BYTES // 4, MAX_BODY_BYTES * 2))
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    raw = dumps(body)
    if draw(st.booleans()):
        req = http_request(b"POST", path.encode(), None, chunks=_chunked(raw, [16384] * 20, False, False))
    else:
        req = http_request(b"POST", path.encode(), raw)
    return Case("oversized" if len(raw) > MAX_BODY_BYTES else "large", req, "POST", True)


@st.composite
def truncated_case(draw: st.DrawFn) -> Case:
    """Content-Length larger than what is sent, then EOF: an answer or a close, promptly."""
    body = draw(st.sampled_from([VALID]) | garbage_bodies)
    cut = draw(st.integers(0, len(body)))
    req = http_request(b"POST", draw(targets), body)
    return Case("truncated", req[:len(req) - len(body) + cut], "POST", False)


@st.composite
def wire_case(draw: st.DrawFn) -> Case:
    head = draw(wire_methods) + b" " + draw(wire_paths) + b" " + draw(wire_versions) + b"\r\nHost: x\r\n"
    head += b"".join(k + b": " + v + b"\r\n" for k, v in draw(wire_header_lines))
    body = draw(st.binary(max_size=80) | st.just(VALID))
    tail = draw(st.sampled_from([b"Content-Length: %d\r\n\r\n" % len(body), b"\r\n", b"", b"\n\n"]))
    return Case("wire", head + tail + body, "HEAD" if head.startswith(b"HEAD ") else "GET", False)


@st.composite
def abort_case(draw: st.DrawFn) -> Case:
    path = draw(inference_paths)
    body = valid_body(path, max_tokens=draw(st.integers(1, 64)), stream=draw(st.booleans()))
    return Case("abort", http_request(b"POST", path.encode(), dumps(body)), "POST", False,
                abort_after=draw(st.integers(1, 400)))


CASES = st.one_of(
    valid_case(), valid_case(), wrong_field_case(), garbage_case(), garbage_case(), unknown_model_case(),
    odd_prompt_case(), method_case(), headers_case(), headers_case(), chunked_case(), large_case(),
    truncated_case(), wire_case(), wire_case(), abort_case(),
)


PER_EXAMPLE = 20  # cases drawn per hypothesis example: its per-example overhead dominates


def generate(n: int, seed: int) -> list[Case]:
    """n cases, deterministic for (n, seed) and this hypothesis version."""
    out: list[Case] = []
    attempt = 0
    while len(out) < n:
        want = -(-(n - len(out)) // PER_EXAMPLE)

        @settings(max_examples=want, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @hyp_seed(seed * 7919 + attempt)
        @given(cases=st.lists(CASES, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
        def collect(cases: list[Case]) -> None:
            out.extend(cases[:n - len(out)])

        collect()
        attempt += 1
    return out
