"""JWKS: parse a key set (PyJWT's PyJWK), and keep one current, from a URI or a file.

From `jwksUri`: fetched at start, refreshed every `jwksRefreshInterval` in the background
(failures retry sooner, with backoff), and refetched at once when a token names a kid we
do not have (key rotation), at most once per `jwksRefetchMinInterval` and coalesced (a
burst of such tokens makes one fetch). A failed or bad fetch keeps the last good keys.
From `jwksFile`: read at load, watched like the route config (a bad file keeps the old keys).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import aiohttp
import jwt
import orjson

from ..config.errors import ConfigError, ConfigProblem
from ..config.yaml_source import read_config_file

__all__ = ["JwksDoc", "JwksStore", "load_jwks_bytes", "load_jwks_file"]

log = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class JwksDoc:
    keys: Mapping[str, jwt.PyJWK]  # kid ("" for a key without one) -> key, its algorithm bound
    source: str
    digest: str
    warnings: tuple[str, ...] = ()


def load_jwks_bytes(data: bytes | str, source: str = "<string>", base_dir: Path | None = None) -> JwksDoc:
    """A JWKS document -> usable verification keys; ConfigError when none is usable."""
    raw = data.encode() if isinstance(data, str) else data
    digest = hashlib.sha256(raw).hexdigest()
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ConfigError([ConfigProblem(source, "", "", f"not JSON: {e}")]) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("keys"), list):
        raise ConfigError([ConfigProblem(source, "", "keys", "a JWKS is an object with a 'keys' list")])
    keys: dict[str, jwt.PyJWK] = {}
    warnings: list[str] = []
    for i, jwk in enumerate(obj["keys"]):
        where = f"{source}: keys[{i}]"
        if not isinstance(jwk, dict):
            warnings.append(f"{where}: not an object, skipped")
            continue
        if jwk.get("use", "sig") != "sig":
            continue  # encryption keys do not verify signatures
        if jwk.get("kty") == "oct" or "d" in jwk:
            warnings.append(f"{where}: symmetric or private key material, skipped (a JWKS publishes public keys)")
            continue
        try:
            key = jwt.PyJWK(jwk)
        except jwt.PyJWTError as e:
            warnings.append(f"{where}: unusable key skipped: {e}")
            continue
        kid = jwk.get("kid", "")
        kid = kid if isinstance(kid, str) else str(kid)
        if kid in keys:
            warnings.append(f"{where}: duplicate kid {kid!r}, the first one is used")
            continue
        keys[kid] = key
    if not keys:
        raise ConfigError([ConfigProblem(source, "", "keys", "no usable signature key" +
                                         (f" ({'; '.join(warnings)})" if warnings else ""))])
    return JwksDoc(MappingProxyType(keys), source, digest, tuple(warnings))


def load_jwks_file(path: str | Path) -> JwksDoc:
    return load_jwks_bytes(read_config_file(path), str(path))


class JwksStore:
    """The current keys of one JWKS source (per worker)."""

    def __init__(self, uri: str, initial: JwksDoc | None, *, refresh_s: float, refetch_min_s: float,
                 timeout_s: float, on_fetch: Callable[[str], None] | None = None) -> None:
        self.uri = uri  # "" for a file source (install() is then fed by its watcher)
        self.keys: Mapping[str, jwt.PyJWK] = initial.keys if initial is not None else MappingProxyType({})
        self.digest = initial.digest if initial is not None else ""
        self.generation = 0  # bumped at every change of keys: cached verdicts are dropped
        self.refresh_s = refresh_s
        self.refetch_min_s = refetch_min_s
        self.timeout_s = timeout_s
        self.on_fetch = on_fetch  # metric hook: "ok" | "error" | "invalid"
        self.last_error = ""
        self.session: aiohttp.ClientSession | None = None
        self._last_attempt = -float("inf")
        self._inflight: asyncio.Future[bool] | None = None
        self._stop = asyncio.Event()

    @property
    def loaded(self) -> bool:
        return bool(self.keys)

    def install(self, doc: JwksDoc) -> None:
        for w in doc.warnings:
            log.warning("jwks: %s", w)
        if doc.digest != self.digest:
            self.keys, self.digest = doc.keys, doc.digest
            self.generation += 1
            log.info("jwks: %d key(s) installed from %s (kids: %s)", len(doc.keys), doc.source,
                     ", ".join(sorted(doc.keys)) or "-")

    def on_file_error(self, err: ConfigError) -> None:
        self.last_error = str(err)
        if self.on_fetch is not None:
            self.on_fetch("invalid")

    # --- URI source --------------------------------------------------------------------
    async def run(self, session: aiohttp.ClientSession) -> None:
        """Fetch now, then refresh until stop(); failures back off from 1 s to refresh_s."""
        self.session = session
        failures = 0
        while not self._stop.is_set():
            ok = await self.fetch()
            failures = 0 if ok else failures + 1
            delay = self.refresh_s if ok else min(self.refresh_s, 2.0 ** min(failures - 1, 6))
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()

    async def refetch_for_unknown_kid(self) -> bool:
        """One fetch for a kid we do not have, unless one ran within refetch_min_s. True when
        the keys may have changed (the caller looks again)."""
        if not self.uri or self.session is None:
            return False
        if self._inflight is not None:  # join the fetch under way
            return await asyncio.shield(self._inflight)
        if time.monotonic() - self._last_attempt < self.refetch_min_s:
            return False
        return await self.fetch()

    async def fetch(self) -> bool:
        if self._inflight is not None:
            return await asyncio.shield(self._inflight)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inflight = fut
        try:
            ok = await self._fetch_once()
        except BaseException:
            fut.set_result(False)
            raise
        finally:
            self._inflight = None
        fut.set_result(ok)
        return ok

    async def _fetch_once(self) -> bool:
        assert self.session is not None
        self._last_attempt = time.monotonic()
        result = "error"
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.get(self.uri, timeout=timeout, headers={"accept": "application/json"}) as r:
                if r.status != 200:
                    raise OSError(f"HTTP {r.status}")
                body = await r.content.read(MAX_JWKS_BYTES + 1)
                if len(body) > MAX_JWKS_BYTES:
                    raise OSError(f"larger than {MAX_JWKS_BYTES} bytes")
            result = "invalid"
            self.install(load_jwks_bytes(body, self.uri))
            result = "ok"
            self.last_error = ""
            return True
        except (OSError, aiohttp.ClientError, asyncio.TimeoutError, ConfigError) as e:
            self.last_error = f"{self.uri}: {e or type(e).__name__}"
            log.warning("jwks: fetch failed, keeping the %d key(s) we have: %s", len(self.keys), self.last_error)
            return False
        finally:
            if self.on_fetch is not None:
                self.on_fetch(result)

