"""Per-request cost of authentication (pytest-benchmark): an API key, a JWT whose verdict
is cached (a client re-sending its token), and a JWT verified from scratch per algorithm."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest

import jwt_keys as jk
from kthena_router.identity.authenticate import Authenticator
from kthena_router.identity.config import AuthConfig
from kthena_router.identity.jwks import JwksStore, load_jwks_bytes
from kthena_router.identity.jwt_verify import JwtVerifier
from kthena_router.identity.keys import load_keys_bytes
from kthena_router.identity.metrics import AuthMetrics

KEYS = {alg: jk.new_key(f"k-{alg}", alg) for alg in ("RS256", "ES256", "EdDSA")}


def _auth() -> Authenticator:
    entries = "".join(f"- {{name: k{i}, sha256: {hashlib.sha256(f'sk-{i}'.encode()).hexdigest()}, tenant: t}}\n"
                      for i in range(1000))
    ks = load_keys_bytes("keys:\n" + entries, "keys.yaml")
    store = JwksStore("", load_jwks_bytes(json.dumps(jk.jwks(*KEYS.values())), "jwks"), refresh_s=60,
                      refetch_min_s=60, timeout_s=1)
    cfg = AuthConfig(issuer="https://idp.test", audiences=("kthena-router",), jwks_file="/j", api_keys_file="/k")
    return Authenticator(cfg, ks, JwtVerifier(cfg, store), AuthMetrics(None))


def _run(loop: asyncio.AbstractEventLoop, auth: Authenticator, headers: dict[str, str]) -> Any:
    coro = auth.authenticate(headers)
    try:  # no await inside on these paths: drive the coroutine to its end without the loop
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("authenticate suspended")


def test_bench_api_key(benchmark: Any) -> None:
    auth = _auth()
    ident = benchmark(_run, None, auth, {"authorization": "Bearer sk-500"})
    assert ident.key_name == "k500"


def test_bench_jwt_cached(benchmark: Any) -> None:
    auth = _auth()
    headers = {"authorization": f"Bearer {KEYS['RS256'].sign(jk.claims())}"}
    ident = benchmark(_run, None, auth, headers)
    assert ident.user == "alice"


@pytest.mark.parametrize("alg", list(KEYS))
def test_bench_jwt_verify(benchmark: Any, alg: str) -> None:
    auth = _auth()
    assert auth.jwt is not None
    headers = {"authorization": f"Bearer {KEYS[alg].sign(jk.claims())}"}

    def uncached() -> Any:
        auth.jwt._cache.clear()  # type: ignore[union-attr]
        return _run(None, auth, headers)

    assert benchmark(uncached).source == "jwt"
