"""The identity of one request, as authentication found it.

Rate limits, fair queuing and session stickiness read it; only the identity package
builds it. `ANONYMOUS` is the identity of every request when no auth is configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_NO_CLAIMS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str  # "" when unknown (anonymous, or a credential that names no tenant)
    user: str  # JWT user claim (default `sub`) or the API key's user
    priority: str  # priority class name; "" = the route's / router's default class
    source: str  # "anonymous" | "api_key" | "jwt"
    key_name: str = ""  # the API key's name in the keys file (never the key itself)
    claims: Mapping[str, Any] = field(default_factory=lambda: _NO_CLAIMS)  # verified JWT claims (JWTClaim session keys)
    limits: Any = None  # per-key limits from the keys file (the rate-limit package's type)


ANONYMOUS = Identity(tenant="", user="", priority="", source="anonymous")
