"""401 answers: one distinct reason each, OpenAI-style body, RFC 6750 WWW-Authenticate.

RFC 6750 section 3.1: a request without credentials gets the challenge alone (no error
code); one whose token (a JWT or an API key, both sent as a bearer token) is invalid gets
error="invalid_token" and a description. The JWKS being unavailable is the router's
problem, not the client's: 503 with Retry-After.
"""

from __future__ import annotations

from ..errors import RequestError

__all__ = ["AuthRefused", "REASONS"]

REALM = 'Bearer realm="kthena-router"'

# reason (metric label and error code) -> message
REASONS: dict[str, str] = {
    "missing_credentials": "authentication required: send an API key or a token as "
                           "'Authorization: Bearer <credential>' (or an API key as 'x-api-key')",
    "unsupported_scheme": "the Authorization header must use the Bearer scheme",
    "invalid_api_key": "invalid API key",
    "malformed_token": "the token is not a well-formed JWT",
    "token_expired": "the token has expired",
    "token_not_yet_valid": "the token is not yet valid",
    "invalid_audience": "the token's audience is not accepted by this router",
    "invalid_issuer": "the token's issuer is not accepted by this router",
    "invalid_signature": "the token's signature does not verify",
    "unknown_kid": "the token's signing key (kid) is not in the router's key set",
    "disallowed_alg": "the token's signing algorithm is not allowed",
    "missing_claim": "the token lacks a required claim",
    "invalid_claim": "a token claim is not valid",
    "jwks_unavailable": "the router cannot verify tokens yet: its key set (JWKS) could not be loaded",
}


class AuthRefused(RequestError):
    def __init__(self, reason: str, detail: str = "", source: str = "none") -> None:
        message = REASONS[reason] + (f": {detail}" if detail else "")
        if reason == "jwks_unavailable":
            super().__init__(503, message, code=reason, headers=[(b"retry-after", b"5")])
        else:
            challenge = REALM
            if reason not in ("missing_credentials", "unsupported_scheme"):
                desc = message.replace("\\", "").replace('"', "'")
                challenge += f', error="invalid_token", error_description="{desc}"'
            super().__init__(401, message, code=reason,
                             headers=[(b"www-authenticate", challenge.encode("latin-1", "replace"))])
        self.reason = reason
        self.source = source

