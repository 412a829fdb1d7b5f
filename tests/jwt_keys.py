"""Signing keys, JWKS documents and tokens for identity tests (keys generated with
`cryptography`, tokens signed with PyJWT; the forged ones are built by hand), and a JWKS
server on 127.0.0.1 whose document a test can change or take down."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ALGS = {"RS256": "rsa", "ES256": "ec", "EdDSA": "ed"}


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    @property
    def public(self) -> Any:
        return self.private.public_key()

    def jwk(self) -> dict[str, Any]:
        d = json.loads(jwt.get_algorithm_by_name(self.alg).to_jwk(self.public))
        return {**d, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def public_pem(self) -> bytes:
        return self.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **header})


def new_key(kid: str, alg: str = "RS256") -> SigningKey:
    kind = ALGS[alg]
    if kind == "rsa":
        private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif kind == "ec":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        private = ed25519.Ed25519PrivateKey.generate()
    return SigningKey(kid, alg, private)


def jwks(*keys: SigningKey) -> dict[str, Any]:
    return {"keys": [k.jwk() for k in keys]}


def claims(sub: str = "alice", *, iss: str = "https://idp.test", aud: str = "kthena-router", ttl: float = 300,
           **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": sub, "iss": iss, "aud": aud, "iat": now, "exp": now + int(ttl), **extra}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(payload: dict[str, Any], kid: str) -> str:
    """`alg: none`: no signature at all."""
    head = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    return f"{head}.{_b64(json.dumps(payload).encode())}."


def hmac_with_public_key(payload: dict[str, Any], key: SigningKey) -> str:
    """The algorithm-confusion forgery: HS256 'signed' with the RSA public key's PEM."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    signing_input = f"{head}.{_b64(json.dumps(payload).encode())}"
    sig = hmac.new(key.public_pem(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(sig)}"


def tampered(token: str) -> str:
    """Same header and claims, one signature byte changed (not a padding bit)."""
    head, body, sig = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
    raw[len(raw) // 2] ^= 0x01
    return f"{head}.{body}.{_b64(bytes(raw))}"


@dataclass
class JwksServer:
    """GET /jwks.json on 127.0.0.1 from a thread; `doc` can be replaced, `down` answers 503."""

    doc: dict[str, Any]
    down: bool = False
    fetches: int = 0
    server: ThreadingHTTPServer | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"

    def start(self) -> "JwksServer":
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.fetches += 1
                if outer.down:
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body = json.dumps(outer.doc).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def serve(doc: dict[str, Any]) -> Iterator[JwksServer]:
    srv = JwksServer(doc).start()
    try:
        yield srv
    finally:
        srv.stop()
