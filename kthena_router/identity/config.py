"""The router configuration's `auth` section -> AuthConfig.

Kthena's fields (JWT): ``issuer``, ``audiences``, ``jwksUri``. Ours, next to them:

    auth:
      issuer: https://idp.example.com/
      audiences: [kthena-router]
      jwksUri: https://idp.example.com/.well-known/jwks.json   # or jwksFile: jwks.json (one of)
      algorithms: [RS256, ES256, EdDSA]      # allow-list; HMAC and "none" are refused
      clockSkewSeconds: 30                   # leeway for exp / nbf / iat
      requiredClaims: [exp]                  # besides the user claim
      userClaim: sub                         # dotted paths reach nested claims ("org.user")
      tenantClaim: org                       # optional; when set, a token must carry it
      priorityClaim: tier                    # optional; its value is the priority class name
      jwksRefreshInterval: 5m                # background refresh of jwksUri
      jwksRefetchMinInterval: 30s            # an unknown kid refetches at most this often
      jwksTimeout: 5s
      apiKeysFile: api-keys.yaml             # keys.py; reloads when it changes

Paths are relative to the router configuration file. The keys file and the JWKS file are
read here too, so that a router configuration naming a bad one does not load (the parent
exits 2 naming the file and field; a reload keeps the old configuration).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..config.checks import check_list, check_str, positive_duration, type_name
from ..config.errors import ConfigError
from .jwks import JwksDoc, load_jwks_file
from .keys import KeySet, load_keys_file

__all__ = ["AuthConfig", "DEFAULT_ALGORITHMS", "parse_auth"]

DEFAULT_ALGORITHMS = ("RS256", "ES256", "EdDSA")
# Asymmetric algorithms PyJWT verifies with a public key from a JWKS. HMAC is never
# accepted: a JWKS holds public keys, and an HS256 token "signed" with one is the classic
# algorithm-confusion forgery.
ALLOWED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                      "ES256", "ES384", "ES512", "EdDSA")

_KNOWN = ("issuer", "audiences", "jwksUri", "jwksFile", "algorithms", "clockSkewSeconds", "requiredClaims",
          "userClaim", "tenantClaim", "priorityClaim", "jwksRefreshInterval", "jwksRefetchMinInterval",
          "jwksTimeout", "apiKeysFile")


@dataclass(frozen=True, slots=True)
class AuthConfig:
    issuer: str = ""  # "" = not checked
    audiences: tuple[str, ...] = ()  # () = not checked; else the token's aud must name one
    jwks_uri: str = ""
    jwks_file: str = ""  # absolute path
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    clock_skew_s: float = 30.0
    required_claims: tuple[str, ...] = ("exp",)
    user_claim: str = "sub"
    tenant_claim: str = ""
    priority_claim: str = ""
    jwks_refresh_s: float = 300.0
    jwks_refetch_min_s: float = 30.0
    jwks_timeout_s: float = 5.0
    api_keys_file: str = ""  # absolute path
    # Contents read at load (not settings: a changed file alone does not make a new config).
    keys: KeySet | None = field(default=None, compare=False, repr=False)
    jwks: JwksDoc | None = field(default=None, compare=False, repr=False)

    @property
    def jwt(self) -> bool:
        return bool(self.jwks_uri or self.jwks_file)


class Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...
    def warn(self, path: str, message: str) -> None: ...


def _claim(c: Collector, v: Any, path: str) -> str:
    s = check_str(c, v, path)
    return s.strip() if s else ""


def _path(c: Collector, v: Any, path: str, base_dir: Path) -> str:
    s = check_str(c, v, path)
    return str((base_dir / os.path.expanduser(s)).resolve()) if s else ""


def _load(c: Collector, path: str, what: str, loader: Any) -> Any:
    try:
        return loader(path)
    except ConfigError as e:
        for p in e.problems:  # the keys/JWKS file's own problems, each naming its file and field
            c.err(what, str(p))
        return None


def parse_auth(c: Collector, v: Any, base_dir: Path) -> AuthConfig | None:
    """None when auth is absent or an empty placeholder (Kthena's chart ships one)."""
    if v is None:
        return None
    if not isinstance(v, dict):
        c.err("auth", f"must be a mapping, got {type_name(v)}")
        return None
    for k in v:
        if k not in _KNOWN:
            c.err(f"auth.{k}", f"unknown field (known: {', '.join(_KNOWN)})")
    issuer = check_str(c, v.get("issuer"), "auth.issuer", allow_empty=True) or ""
    audiences = tuple(a for i, a in enumerate(check_list(c, v.get("audiences"), "auth.audiences"))
                      if check_str(c, a, f"auth.audiences[{i}]", allow_empty=True))
    jwks_uri = check_str(c, v.get("jwksUri"), "auth.jwksUri", allow_empty=True) or ""
    jwks_file = _path(c, v.get("jwksFile"), "auth.jwksFile", base_dir)
    keys_file = _path(c, v.get("apiKeysFile"), "auth.apiKeysFile", base_dir)
    ours = [k for k in v if k not in ("issuer", "audiences", "jwksUri")]
    if not (issuer or audiences or jwks_uri or ours):
        return None  # Kthena's empty placeholder: auth off
    if jwks_uri:
        u = urlsplit(jwks_uri)
        if u.scheme not in ("http", "https") or not u.hostname:
            c.err("auth.jwksUri", f"must be an http(s) URL, got {jwks_uri!r}")
        elif u.scheme == "http" and u.hostname not in ("127.0.0.1", "localhost", "::1"):
            c.warn("auth.jwksUri", "plain http: the keys that authenticate every request travel unprotected")
    if jwks_uri and jwks_file:
        c.err("auth.jwksFile", "set jwksUri or jwksFile, not both")
    jwt_on = bool(jwks_uri or jwks_file)
    if not jwt_on and not keys_file:
        c.err("auth", "names no credential source: set jwksUri or jwksFile (JWT) and/or apiKeysFile")
    if jwt_on and not issuer:
        c.warn("auth.issuer", "not set: tokens of any issuer signed by these keys are accepted")
    if jwt_on and not audiences:
        c.warn("auth.audiences", "not set: the token's aud claim is not checked")

    algorithms = DEFAULT_ALGORITHMS
    if "algorithms" in v:
        algs: list[str] = []
        for i, a in enumerate(check_list(c, v["algorithms"], "auth.algorithms")):
            p = f"auth.algorithms[{i}]"
            if not isinstance(a, str) or a not in ALLOWED_ALGORITHMS:
                why = " (HMAC and 'none' are never accepted: a JWKS holds public keys)" \
                    if isinstance(a, str) and (a.upper().startswith("HS") or a.lower() == "none") else ""
                c.err(p, f"must be one of {', '.join(ALLOWED_ALGORITHMS)}, got {a!r}{why}")
            elif a not in algs:
                algs.append(a)
        if not algs:
            c.err("auth.algorithms", "must name at least one algorithm")
        algorithms = tuple(algs) or DEFAULT_ALGORITHMS

    skew = v.get("clockSkewSeconds", 30)
    if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not 0 <= skew <= 600:
        c.err("auth.clockSkewSeconds", f"must be a number of seconds in 0..600, got {skew!r}")
        skew = 30
    required: list[str] = []
    for i, x in enumerate(check_list(c, v.get("requiredClaims", ["exp"]), "auth.requiredClaims")):
        s = check_str(c, x, f"auth.requiredClaims[{i}]")
        if s:
            required.append(s)
    user_claim = _claim(c, v.get("userClaim", "sub"), "auth.userClaim") or "sub"

    cfg = AuthConfig(
        issuer=issuer, audiences=audiences, jwks_uri=jwks_uri, jwks_file=jwks_file, algorithms=algorithms,
        clock_skew_s=float(skew), required_claims=tuple(required), user_claim=user_claim,
        tenant_claim=_claim(c, v.get("tenantClaim"), "auth.tenantClaim"),
        priority_claim=_claim(c, v.get("priorityClaim"), "auth.priorityClaim"),
        jwks_refresh_s=positive_duration(c, v.get("jwksRefreshInterval"), "auth.jwksRefreshInterval", 300.0),
        jwks_refetch_min_s=positive_duration(c, v.get("jwksRefetchMinInterval"), "auth.jwksRefetchMinInterval", 30.0),
        jwks_timeout_s=positive_duration(c, v.get("jwksTimeout"), "auth.jwksTimeout", 5.0),
        api_keys_file=keys_file,
        keys=_load(c, keys_file, "auth.apiKeysFile", load_keys_file) if keys_file else None,
        jwks=_load(c, jwks_file, "auth.jwksFile", load_jwks_file) if jwks_file else None,
    )
    return cfg
