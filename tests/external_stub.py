"""A local HTTPS stand-in for third-party LLM APIs (OpenAI- and Anthropic-compatible).

Listens on 127.0.0.1 with a certificate from a CA made at test time (`make_pki`), so that
tests exercise real TLS verification without any traffic leaving the machine. It checks
the credential header it was told to expect (401 otherwise), records every request
(path, headers, body) and answers chat/completions, completions, responses and messages,
plain or streamed (SSE, chunked), in each API's own format.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(out: Path, tag: str) -> Pki:
    """A CA and a server certificate (localhost, 127.0.0.1) it signed, as PEM files."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(f"test CA {tag}")).issuer_name(_name(f"test CA {tag}"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out.mkdir(parents=True, exist_ok=True)
    pki = Pki(out / f"ca-{tag}.pem", out / f"cert-{tag}.pem", out / f"key-{tag}.pem")
    pki.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    return pki


@dataclass
class Seen:
    path: str
    headers: dict[str, str]  # lower-case names
    body: dict[str, Any]
    status: int = 200


@dataclass
class StubState:
    # credential expected per path prefix: (header name, value); "" prefix = any path
    expect: dict[str, tuple[str, str]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _usage_openai() -> dict[str, int]:
    return {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def _sse(events: list[tuple[str | None, Any]]) -> list[bytes]:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode())
    return out


def _answer(kind: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, list[bytes] | None]:
    """(JSON body, or SSE events) for one API; the text says which model was asked for."""
    model = body.get("model")
    text = f"stub answer from {model}"
    stream = body.get("stream") is True
    if kind == "chat":
        if not stream:
            return {"id": "chatcmpl-1", "object": "chat.completion", "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}], "usage": _usage_openai()}, None
        chunks = [(None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
                          "choices": [{"index": 0, "delta": {"content": w + " "}, "finish_reason": None}]})
                  for w in text.split()]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append((None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
                                  "choices": [], "usage": _usage_openai()}))
        return None, _sse(chunks + [(None, "[DONE]")])
    if kind == "completions":
        if not stream:
            return {"id": "cmpl-1", "object": "text_completion", "model": model,
                    "choices": [{"index": 0, "text": text, "finish_reason": "stop"}], "usage": _usage_openai()}, None
        chunks = [(None, {"id": "cmpl-1", "object": "text_completion", "model": model,
                          "choices": [{"index": 0, "text": w + " ", "finish_reason": None}]}) for w in text.split()]
        return None, _sse(chunks + [(None, "[DONE]")])
    if kind == "responses":
        resp = {"id": "resp_1", "object": "response", "created_at": 1, "model": model, "status": "completed",
                "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}}
        if not stream:
            return resp, None
        created = {**resp, "status": "in_progress", "output": [], "usage": None}
        return None, _sse([("response.created", {"type": "response.created", "response": created}),
                           ("response.output_text.delta", {"type": "response.output_text.delta", "delta": text,
                                                           "item_id": "msg_1", "output_index": 0,
                                                           "content_index": 0}),
                           ("response.completed", {"type": "response.completed", "response": resp})])
    # Anthropic Messages API
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
           "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
           "usage": {"input_tokens": 7, "output_tokens": 3}}
    if not stream:
        return msg, None
    start = {**msg, "content": [], "stop_reason": None, "usage": {"input_tokens": 7, "output_tokens": 1}}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": w + " "}}) for w in text.split()]
    events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
               ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                  "usage": {"output_tokens": 3}}),
               ("message_stop", {"type": "message_stop"})]
    return None, _sse(events)


_KINDS = {"chat/completions": "chat", "completions": "completions", "responses": "responses", "messages": "messages"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        headers = {k.lower(): v for k, v in self.headers.items()}
        seen = Seen(self.path, headers, body)
        st = self.server.state
        with st.lock:
            st.seen.append(seen)
        for prefix, (name, value) in st.expect.items():
            if self.path.startswith(prefix) and headers.get(name) != value:
                seen.status = 401
                self._json(401, {"error": {"message": "invalid credential", "type": "authentication_error"}})
                return
        kind = next((k for suffix, k in _KINDS.items() if self.path.endswith("/" + suffix)), None)
        if kind is None:
            seen.status = 404
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        obj, events = _answer(kind, body)
        if obj is not None:
            self._json(200, obj)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for ev in events or []:  # one chunk per event: relayed chunk by chunk
            self.wfile.write(f"{len(ev):x}\r\n".encode() + ev + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: StubState


class StubProvider:
    """The server in a background thread; `state` is shared with the test."""

    def __init__(self, pki: Pki) -> None:
        self.state = StubState()
        self._srv = _Server(("127.0.0.1", 0), _Handler)
        self._srv.state = self.state
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(pki.cert_pem, pki.key_pem)
        self._srv.socket = ctx.wrap_socket(self._srv.socket, server_side=True)
        self.port = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)
        self._thread.start()

    def seen(self, prefix: str = "") -> list[Seen]:
        with self.state.lock:
            return [s for s in self.state.seen if s.path.startswith(prefix)]

    def reset(self) -> None:
        with self.state.lock:
            self.state.seen.clear()

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
