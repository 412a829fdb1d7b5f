"""Verify a JWT with PyJWT against the current JWKS and turn its claims into an Identity.

Order of checks, so that each refusal names its real reason: well-formed header, algorithm
in the allow-list (`none` and HMAC never are), a key for its kid (an unknown kid refetches
the JWKS once, rate-limited), then PyJWT verifies the signature with that key, its
algorithm bound to the key (PyJWK), and exp / nbf / iat with the clock skew as leeway,
aud, iss and the required claims.

Verified tokens are cached (bounded, per worker) until they expire or the key set changes:
clients send the same token on every request, and a signature check costs tens of µs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jwt

from .config import AuthConfig
from .jwks import JwksStore
from .model import Identity
from .refusal import AuthRefused

__all__ = ["JwtVerifier"]

CACHE_SIZE = 4096


def _claim(claims: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    v: Any = claims
    for part in path:
        if not isinstance(v, Mapping) or part not in v:
            return None
        v = v[part]
    return v


class JwtVerifier:
    def __init__(self, cfg: AuthConfig, store: JwksStore) -> None:
        self.cfg = cfg
        self.store = store
        self.algorithms = frozenset(cfg.algorithms)
        self.options: Any = {"require": list(cfg.required_claims), "verify_aud": bool(cfg.audiences)}
        self.user_path = tuple(cfg.user_claim.split("."))
        self.tenant_path = tuple(cfg.tenant_claim.split(".")) if cfg.tenant_claim else ()
        self.priority_path = tuple(cfg.priority_claim.split(".")) if cfg.priority_claim else ()
        # token -> (identity, expiry (epoch s, inf if none), key-set generation)
        self._cache: dict[str, tuple[Identity, float, int]] = {}

    async def verify(self, token: str) -> Identity:
        hit = self._cache.get(token)
        if hit is not None:
            ident, expiry, gen = hit
            if gen == self.store.generation and time.time() < expiry:
                return ident
            del self._cache[token]
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthRefused("malformed_token", source="jwt") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise AuthRefused("disallowed_alg", f"{alg!r} (allowed: {', '.join(self.cfg.algorithms)})", "jwt")
        kid = header.get("kid", "")
        if not isinstance(kid, str):
            raise AuthRefused("malformed_token", "kid must be a string", "jwt")
        key = self.store.keys.get(kid)
        if key is None and await self.store.refetch_for_unknown_kid():
            key = self.store.keys.get(kid)
        if key is None:
            if not self.store.loaded:
                raise AuthRefused("jwks_unavailable", self.store.last_error, "jwt")
            raise AuthRefused("unknown_kid", repr(kid) if kid else "the token names no kid", "jwt")
        gen = self.store.generation
        claims = self._decode(token, key, alg)
        ident = self._identity(claims)
        exp = claims.get("exp")
        expiry = float(exp) + self.cfg.clock_skew_s if isinstance(exp, (int, float)) else float("inf")
        if len(self._cache) >= CACHE_SIZE:
            del self._cache[next(iter(self._cache))]  # oldest first
        self._cache[token] = (ident, expiry, gen)
        return ident

    def _decode(self, token: str, key: jwt.PyJWK, alg: str) -> dict[str, Any]:
        cfg = self.cfg
        try:
            return jwt.decode(token, key, algorithms=[alg], audience=list(cfg.audiences) or None,
                              issuer=cfg.issuer or None, leeway=cfg.clock_skew_s, options=self.options)
        except jwt.ExpiredSignatureError:
            raise AuthRefused("token_expired", source="jwt") from None
        except jwt.ImmatureSignatureError as e:  # nbf or iat in the future
            raise AuthRefused("token_not_yet_valid", "nbf" if "nbf" in str(e) else "iat", "jwt") from None
        except jwt.InvalidAudienceError:
            raise AuthRefused("invalid_audience", f"expected one of {', '.join(cfg.audiences)}", "jwt") from None
        except jwt.InvalidIssuerError:
            raise AuthRefused("invalid_issuer", f"expected {cfg.issuer}", "jwt") from None
        except jwt.InvalidSignatureError:
            raise AuthRefused("invalid_signature", source="jwt") from None
        except jwt.InvalidAlgorithmError:  # the token's alg is not the one bound to its kid's key
            raise AuthRefused("disallowed_alg", f"{alg!r} does not match the key's {key.algorithm_name!r}",
                              "jwt") from None
        except jwt.MissingRequiredClaimError as e:
            raise AuthRefused("missing_claim", repr(e.claim), "jwt") from None
        except jwt.DecodeError:
            raise AuthRefused("malformed_token", source="jwt") from None
        except jwt.PyJWTError as e:  # e.g. a non-numeric iat
            raise AuthRefused("invalid_claim", str(e), "jwt") from None

    def _identity(self, claims: dict[str, Any]) -> Identity:
        cfg = self.cfg
        user = _claim(claims, self.user_path)
        if not isinstance(user, str) or not user:
            raise AuthRefused("missing_claim", f"{cfg.user_claim!r} (the user) must be a non-empty string", "jwt")
        tenant = ""
        if self.tenant_path:
            tenant = _claim(claims, self.tenant_path)
            if not isinstance(tenant, str) or not tenant:
                raise AuthRefused("missing_claim", f"{cfg.tenant_claim!r} (the tenant) must be a non-empty string",
                                  "jwt")
        priority = ""
        if self.priority_path:
            p = _claim(claims, self.priority_path)
            if p is not None and not isinstance(p, str):
                raise AuthRefused("invalid_claim", f"{cfg.priority_claim!r} (the priority class) must be a string",
                                  "jwt")
            priority = p or ""
        return Identity(tenant=tenant, user=user, priority=priority, source="jwt",
                        claims=MappingProxyType(claims))
