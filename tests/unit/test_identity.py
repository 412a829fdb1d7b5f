"""Identity's pure parts: the keys file, the auth section, JWKS parsing, JWT verification
against an in-memory key set (the HTTP paths are in tests/integration/test_identity_*.py)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

import jwt_keys as jk
from kthena_router.config.errors import ConfigError
from kthena_router.identity.authenticate import Authenticator
from kthena_router.identity.config import AuthConfig, parse_auth
from kthena_router.identity.jwks import JwksStore, load_jwks_bytes
from kthena_router.identity.jwt_verify import JwtVerifier
from kthena_router.identity.keys import load_keys_bytes
from kthena_router.identity.metrics import AuthMetrics
from kthena_router.identity.refusal import AuthRefused


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Collect:
    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str]] = []

    def err(self, path: str, message: str) -> None:
        self.errors.append((path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append((path, message))


# --- keys file ---------------------------------------------------------------------------


def test_keys_file_maps_hash_to_identity_and_never_the_key() -> None:
    ks = load_keys_bytes(f"keys:\n- name: a\n  sha256: {sha('sk-a').upper()}\n  tenant: acme\n  user: al\n"
                         f"  priority: high\n  limits: {{inputTokensPerUnit: 10, unit: minute, maxPromptTokens: 5}}\n"
                         f"- name: b\n  sha256: {sha('sk-b')}\n  tenant: beta\n", "keys.yaml")
    a = ks.lookup("sk-a")
    assert a is not None and a.name == "a"
    assert (a.identity.tenant, a.identity.user, a.identity.priority, a.identity.source, a.identity.key_name) == \
        ("acme", "al", "high", "api_key", "a")
    assert a.identity.limits.max_prompt_tokens == 5 and a.identity.limits.limit is not None
    with pytest.raises(AttributeError):
        a.identity.limits.max_prompt_tokens = 1  # frozen: shared by every request of the key
    assert ks.lookup("sk-b").identity.priority == ""  # the route's default class
    assert ks.lookup("sk-c") is None and ks.lookup("") is None
    assert "sk-a" not in repr(ks)


@pytest.mark.parametrize("text,field,words", [
    ("keys:\n- {name: a, key: sk-a, tenant: t}\n", "keys[0].key", "never holds a key itself"),
    ("keys:\n- {name: a, sha256: abc, tenant: t}\n", "keys[0].sha256", "64 hex digits"),
    (f"keys:\n- {{name: a, sha256: {sha('x')}}}\n", "keys[0].tenant", "required"),
    (f"keys:\n- {{name: a, sha256: {sha('x')}, tenant: t}}\n- {{name: a, sha256: {sha('y')}, tenant: t}}\n",
     "keys[1].name", "duplicate key name"),
    (f"keys:\n- {{name: a, sha256: {sha('x')}, tenant: t}}\n- {{name: b, sha256: {sha('x')}, tenant: t}}\n",
     "keys[1].sha256", "already listed as 'a'"),
    (f"keys:\n- {{name: a, sha256: {sha('x')}, tenant: t, limits: 5}}\n", "keys[0].limits", "mapping"),
    (f"keys:\n- {{name: 'a b', sha256: {sha('x')}, tenant: t}}\n", "keys[0].name", "characters"),
    (f"keys:\n- {{name: a, sha256: {sha('x')}, tenant: t, tenat: u}}\n", "keys[0].tenat", "unknown field"),
    ("tokens: []\n", "tokens", "unknown field"),
])
def test_bad_keys_file_names_file_and_field(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_keys_bytes(text, "keys.yaml")
    assert any(p.file == "keys.yaml" and p.field == field and words in p.message for p in ei.value.problems), \
        str(ei.value)


def test_empty_keys_file_refuses_every_key_with_a_warning() -> None:
    ks = load_keys_bytes("keys: []\n", "keys.yaml")
    assert ks.lookup("anything") is None and ks.warnings


# --- auth section ------------------------------------------------------------------------


def test_auth_section_defaults_and_paths(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(f"keys:\n- {{name: a, sha256: {sha('x')}, tenant: t}}\n")
    c = Collect()
    cfg = parse_auth(c, {"jwksUri": "https://idp/jwks", "issuer": "https://idp", "audiences": ["r"],
                         "apiKeysFile": "keys.yaml", "tenantClaim": "org.id", "jwksRefreshInterval": "1m"}, tmp_path)
    assert c.errors == [] and cfg is not None
    assert cfg.api_keys_file == str(tmp_path / "keys.yaml") and cfg.keys is not None
    assert (cfg.algorithms, cfg.clock_skew_s, cfg.user_claim, cfg.tenant_claim, cfg.jwks_refresh_s) == \
        (("RS256", "ES256", "EdDSA"), 30.0, "sub", "org.id", 60.0)
    # the loaded keys are content, not settings: equal configs keep the live authenticator
    assert cfg == AuthConfig(issuer="https://idp", audiences=("r",), jwks_uri="https://idp/jwks",
                             tenant_claim="org.id", jwks_refresh_s=60.0, api_keys_file=str(tmp_path / "keys.yaml"))


@pytest.mark.parametrize("auth,field,words", [
    ({"jwksUri": "https://i/j", "algorithms": ["none"]}, "auth.algorithms[0]", "never accepted"),
    ({"jwksUri": "https://i/j", "algorithms": ["HS256"]}, "auth.algorithms[0]", "HMAC"),
    ({"jwksUri": "https://i/j", "algorithms": []}, "auth.algorithms", "at least one"),
    ({"jwksUri": "https://i/j", "jwksFile": "j.json"}, "auth.jwksFile", "not both"),
    ({"jwksUri": "https://i/j", "clockSkewSeconds": -1}, "auth.clockSkewSeconds", "0..600"),
    ({"jwksUri": "https://i/j", "jwksTimeout": "0s"}, "auth.jwksTimeout", "greater than 0"),
    ({"jwksUri": "https://i/j", "userClaim": 3}, "auth.userClaim", "string"),
    ({"jwksUri": "https://i/j", "jwks": "x"}, "auth.jwks", "unknown field"),
    ({"userClaim": "email"}, "auth", "no credential source"),
])
def test_bad_auth_section(tmp_path: Path, auth: dict[str, Any], field: str, words: str) -> None:
    c = Collect()
    parse_auth(c, auth, tmp_path)
    assert any(p == field and words in m for p, m in c.errors), c.errors


def test_jwks_file_is_read_with_the_section(tmp_path: Path) -> None:
    import json

    (tmp_path / "jwks.json").write_text(json.dumps(jk.jwks(jk.new_key("k1", "ES256"))))
    c = Collect()
    cfg = parse_auth(c, {"jwksFile": "jwks.json", "issuer": "i", "audiences": ["a"]}, tmp_path)
    assert c.errors == [] and cfg is not None and cfg.jwt and list(cfg.jwks.keys) == ["k1"]
    (tmp_path / "jwks.json").write_text("{}")
    parse_auth(c, {"jwksFile": "jwks.json"}, tmp_path)
    assert c.errors and c.errors[0][0] == "auth.jwksFile" and "jwks.json: keys:" in c.errors[0][1]


def test_jwt_without_issuer_or_audience_warns(tmp_path: Path) -> None:
    c = Collect()
    parse_auth(c, {"jwksUri": "http://idp.example/jwks"}, tmp_path)
    assert c.errors == []
    assert {p for p, _ in c.warnings} == {"auth.issuer", "auth.audiences", "auth.jwksUri"}


# --- JWKS --------------------------------------------------------------------------------


def test_jwks_skips_symmetric_and_private_keys() -> None:
    rsa = jk.new_key("r1")
    doc = {"keys": [rsa.jwk(), {"kty": "oct", "k": "c2VjcmV0", "kid": "h"}, {**rsa.jwk(), "kid": "e", "use": "enc"}]}
    parsed = load_jwks_bytes(__import__("json").dumps(doc), "jwks")
    assert list(parsed.keys) == ["r1"] and any("symmetric" in w for w in parsed.warnings)
    with pytest.raises(ConfigError, match="no usable signature key"):
        load_jwks_bytes('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "jwks")
    with pytest.raises(ConfigError, match="not JSON"):
        load_jwks_bytes("<html>", "jwks")


# --- JWT verification --------------------------------------------------------------------

RSA = jk.new_key("rsa-1")
EC = jk.new_key("ec-1", "ES256")
ED = jk.new_key("ed-1", "EdDSA")


def verifier(**cfg: Any) -> tuple[JwtVerifier, JwksStore]:
    import json

    store = JwksStore("", load_jwks_bytes(json.dumps(jk.jwks(RSA, EC, ED)), "jwks"), refresh_s=60,
                      refetch_min_s=60, timeout_s=1)
    base = dict(issuer="https://idp.test", audiences=("kthena-router",), jwks_file="/jwks", clock_skew_s=5.0)
    return JwtVerifier(AuthConfig(**{**base, **cfg}), store), store


def reason(v: JwtVerifier, token: str) -> str:
    with pytest.raises(AuthRefused) as ei:
        asyncio.run(v.verify(token))
    assert ei.value.status == 401 or ei.value.reason == "jwks_unavailable"
    return ei.value.reason


def test_every_algorithm_of_the_default_allow_list_verifies() -> None:
    v, _ = verifier(tenant_claim="org.id", priority_claim="tier")
    for key in (RSA, EC, ED):
        ident = asyncio.run(v.verify(key.sign(jk.claims("bob", org={"id": "acme"}, tier="gold"))))
        assert (ident.user, ident.tenant, ident.priority, ident.source) == ("bob", "acme", "gold", "jwt")
        assert ident.claims["org"] == {"id": "acme"}


def test_each_refusal_names_its_reason() -> None:
    v, _ = verifier()
    now = int(time.time())
    assert reason(v, RSA.sign(jk.claims(ttl=-60))) == "token_expired"
    assert reason(v, RSA.sign(jk.claims(nbf=now + 60))) == "token_not_yet_valid"
    assert reason(v, RSA.sign({**jk.claims(), "iat": now + 60})) == "token_not_yet_valid"
    assert reason(v, RSA.sign(jk.claims(aud="other"))) == "invalid_audience"
    assert reason(v, RSA.sign(jk.claims(iss="https://evil"))) == "invalid_issuer"
    assert reason(v, jk.tampered(RSA.sign(jk.claims()))) == "invalid_signature"
    assert reason(v, jk.unsigned(jk.claims(), "rsa-1")) == "disallowed_alg"
    assert reason(v, jk.hmac_with_public_key(jk.claims(), RSA)) == "disallowed_alg"
    assert reason(v, jk.new_key("rsa-9").sign(jk.claims())) == "unknown_kid"
    assert reason(v, RSA.sign(jk.claims(), kid="ec-1")) == "disallowed_alg"  # RS256 token, ES256 key
    no_exp = jk.claims()
    del no_exp["exp"]
    assert reason(v, RSA.sign(no_exp)) == "missing_claim"
    assert reason(v, RSA.sign({k: x for k, x in jk.claims().items() if k != "sub"})) == "missing_claim"
    assert reason(v, "eyJhbGciOi.not-a-token.x") == "malformed_token"


def test_clock_skew_is_leeway() -> None:
    v, _ = verifier(clock_skew_s=120.0)
    ident = asyncio.run(v.verify(RSA.sign(jk.claims(ttl=-60))))  # expired a minute ago, within skew
    assert ident.user == "alice"


def test_required_tenant_claim() -> None:
    v, _ = verifier(tenant_claim="org")
    assert reason(v, RSA.sign(jk.claims())) == "missing_claim"


def test_cached_verdict_dropped_when_keys_change() -> None:
    import json

    v, store = verifier()
    token = RSA.sign(jk.claims())
    assert asyncio.run(v.verify(token)).user == "alice"
    assert asyncio.run(v.verify(token)).user == "alice"  # cached
    store.install(load_jwks_bytes(json.dumps(jk.jwks(EC)), "jwks"))  # rsa-1 rotated out
    assert reason(v, token) == "unknown_kid"


def test_no_keys_yet_is_503_not_the_clients_fault() -> None:
    store = JwksStore("", None, refresh_s=60, refetch_min_s=60, timeout_s=1)
    v = JwtVerifier(AuthConfig(jwks_file="/x"), store)
    with pytest.raises(AuthRefused) as ei:
        asyncio.run(v.verify(RSA.sign(jk.claims())))
    assert ei.value.status == 503 and (b"retry-after", b"5") in ei.value.headers


def test_authenticator_picks_jwt_or_api_key_by_shape() -> None:
    v, _ = verifier()
    ks = load_keys_bytes(f"keys:\n- {{name: k, sha256: {sha('sk-1')}, tenant: t}}\n", "keys.yaml")
    auth = Authenticator(AuthConfig(jwks_file="/x", api_keys_file="/k"), ks, v, AuthMetrics(None))
    assert asyncio.run(auth.authenticate({"authorization": f"Bearer {RSA.sign(jk.claims())}"})).source == "jwt"
    assert asyncio.run(auth.authenticate({"authorization": "bearer sk-1"})).source == "api_key"
    assert asyncio.run(auth.authenticate({"x-api-key": "sk-1"})).key_name == "k"
    with pytest.raises(AuthRefused) as ei:  # the Authorization header alone decides
        asyncio.run(auth.authenticate({"authorization": "Bearer nope", "x-api-key": "sk-1"}))
    assert ei.value.reason == "invalid_api_key"
    jwt_only = Authenticator(AuthConfig(jwks_file="/x"), None, v, AuthMetrics(None))
    with pytest.raises(AuthRefused) as ei:
        asyncio.run(jwt_only.authenticate({"authorization": "Bearer sk-1"}))
    assert ei.value.reason == "malformed_token"


def test_example_configuration_loads_and_its_demo_key_authenticates() -> None:
    from kthena_router.scheduling.config import load_router_configuration_file

    root = Path(__file__).resolve().parents[2]
    rc = load_router_configuration_file(root / "configs" / "auth" / "router-config.yaml")
    assert rc.auth is not None and rc.auth.keys is not None and not rc.auth.jwt
    found = rc.auth.keys.lookup("sk-demo-0000000000000000")
    assert found is not None and found.identity.tenant == "demo"
