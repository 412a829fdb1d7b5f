"""Authenticator: the request's credentials -> Identity, or AuthRefused (401).

Credentials, in this order:
- `Authorization: Bearer <credential>` (what the OpenAI SDK sends with its api_key): a
  JWT when JWT is configured and the credential has a JWT's shape (three dot-separated
  parts), otherwise an API key;
- `x-api-key: <key>` (Anthropic-style clients).
A request carrying an Authorization header is judged by it alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from .config import AuthConfig
from .jwt_verify import JwtVerifier
from .keys import KeySet
from .metrics import AuthMetrics
from .model import Identity
from .refusal import AuthRefused

__all__ = ["Authenticator"]


def _looks_like_jwt(cred: str) -> bool:
    return cred.count(".") == 2 and cred.startswith("eyJ")  # base64url of '{"'


class Authenticator:
    """Per worker; the installed one is `Forwarder.auth` (None when auth is off)."""

    def __init__(self, cfg: AuthConfig, keys: KeySet | None, jwt_verifier: JwtVerifier | None,
                 metrics: AuthMetrics) -> None:
        self.cfg = cfg
        self.keys = keys  # replaced by the keys file's watcher
        self.jwt = jwt_verifier
        self.metrics = metrics

    def set_keys(self, keys: KeySet) -> None:
        self.keys = keys

    async def authenticate(self, headers: Mapping[str, str]) -> Identity:
        """`headers`: lower-case name -> value (RequestHeaders.by_name)."""
        try:
            ident = await self._authenticate(headers)
        except AuthRefused as refused:
            self.metrics.result(refused.source, refused.reason)
            raise
        self.metrics.result(ident.source, "ok")
        return ident

    async def _authenticate(self, headers: Mapping[str, str]) -> Identity:
        authz = headers.get("authorization")
        if authz is not None:
            scheme, _, cred = authz.strip().partition(" ")
            cred = cred.strip()
            if scheme.lower() != "bearer" or not cred:
                raise AuthRefused("unsupported_scheme", source="none")
            if self.jwt is not None and _looks_like_jwt(cred):
                return await self.jwt.verify(cred)
            return self._api_key(cred)
        key = headers.get("x-api-key")
        if key is not None and key.strip():
            return self._api_key(key.strip())
        raise AuthRefused("missing_credentials", source="none")

    def _api_key(self, key: str) -> Identity:
        if self.keys is None:  # JWT only: a bearer credential that is no JWT
            raise AuthRefused("malformed_token", source="jwt")
        found = self.keys.lookup(key)
        if found is None:
            raise AuthRefused("invalid_api_key", source="api_key")
        return found.identity
