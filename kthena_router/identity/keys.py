"""The API keys file: each key stored as the sha256 of the key, never the key itself.

    keys:
    - name: alice-laptop          # shown in logs and metrics, never the key
      sha256: 5e884898da28...     # printf %s "$KEY" | sha256sum
      tenant: acme
      user: alice                 # optional
      priority: high              # optional: a fairness.priorityClasses name
      limits: {...}               # optional: per-key limits (the rate-limit part's shape)

A presented key is hashed once, looked up by its digest, and the stored digest is
compared with hmac.compare_digest: the lookup only finds candidates, the comparison
decides, and neither depends on the key's bytes in a way that leaks them (the dict
sees a sha256 digest, not the key). The file is watched and reloaded like the route
config (config/watcher.py): a bad file keeps the old keys.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..config.checks import check_list, check_str, type_name
from ..config.errors import ConfigError, ConfigProblem
from ..config.yaml_source import decode_config_text, load_yaml_documents, read_config_file
from .model import Identity

__all__ = ["ApiKey", "KeySet", "load_keys_bytes", "load_keys_file", "hash_key"]

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}")
_KEY_FIELDS = ("name", "sha256", "tenant", "user", "priority", "limits")


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: bytes  # sha256 of the key (32 bytes)
    identity: Identity  # built once per load: no allocation per request


@dataclass(frozen=True, slots=True)
class KeySet:
    by_digest: Mapping[bytes, ApiKey]
    source: str
    digest: str  # sha256 hex of the file (the watcher's change detection)
    warnings: tuple[str, ...] = ()
    names: tuple[str, ...] = field(default=(), repr=False)

    def lookup(self, key: str) -> ApiKey | None:
        d = hash_key(key)
        found = self.by_digest.get(d)
        if found is None or not hmac.compare_digest(found.digest, d):
            return None
        return found


class _Ctx:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[ConfigProblem] = []

    def err(self, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.source, "", path, message))


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _limits(c: _Ctx, v: Any, path: str) -> Mapping[str, Any] | None:
    """Opaque here: a mapping with string keys, kept read-only on Identity.limits; the
    rate-limit part gives it meaning."""
    if v is None:
        return None
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping, got {type_name(v)}")
        return None
    for k in v:
        if not isinstance(k, str) or not k:
            c.err(path, f"keys must be non-empty strings, got {k!r}")
    return _freeze(v)  # type: ignore[no-any-return]


def load_keys_bytes(data: bytes | str, source: str = "<string>", base_dir: Path | None = None) -> KeySet:
    """Validate a keys file; ConfigError naming the file and field of every problem."""
    text, digest = decode_config_text(data, source)
    docs = [d for d in load_yaml_documents(text, source) if d is not None]
    c = _Ctx(source)
    if len(docs) > 1:
        raise ConfigError([ConfigProblem(source, "document 2", "", "an API keys file holds one document")])
    top = docs[0] if docs else {}
    if not isinstance(top, dict):
        raise ConfigError([ConfigProblem(source, "", "", f"must be a mapping with a 'keys' list, got {type_name(top)}")])
    for k in top:
        if k != "keys":
            c.err(str(k), "unknown field (known: keys)")
    out: dict[bytes, ApiKey] = {}
    names: dict[str, int] = {}
    for i, item in enumerate(check_list(c, top.get("keys"), "keys")):
        p = f"keys[{i}]"
        if not isinstance(item, dict):
            c.err(p, f"must be a mapping, got {type_name(item)}")
            continue
        for k in item:
            if k in ("key", "apiKey", "secret", "value"):
                c.err(f"{p}.{k}", "a keys file never holds a key itself: store its sha256 "
                                  "(printf %s \"$KEY\" | sha256sum) in 'sha256'")
            elif k not in _KEY_FIELDS:
                c.err(f"{p}.{k}", f"unknown field (known: {', '.join(_KEY_FIELDS)})")
        name = check_str(c, item.get("name"), f"{p}.name")
        if "name" not in item:
            c.err(f"{p}.name", "required field is missing")
        elif name is not None and not _NAME.fullmatch(name):
            c.err(f"{p}.name", f"must be 1-128 characters of letters, digits and ._@:- , got {name!r}")
            name = None
        if name is not None:
            if name in names:
                c.err(f"{p}.name", f"duplicate key name {name!r} (also keys[{names[name]}])")
            names.setdefault(name, i)
        sha = item.get("sha256")
        d: bytes | None = None
        if sha is None:
            c.err(f"{p}.sha256", "required field is missing")
        elif not isinstance(sha, str) or not _HEX64.fullmatch(sha):
            c.err(f"{p}.sha256", "must be the 64 hex digits of the key's sha256")
        else:
            d = bytes.fromhex(sha)
            if d in out:
                c.err(f"{p}.sha256", f"the same key is already listed as {out[d].name!r}")
                d = None
        tenant = check_str(c, item.get("tenant"), f"{p}.tenant")
        if "tenant" not in item:
            c.err(f"{p}.tenant", "required field is missing")
        user = check_str(c, item.get("user"), f"{p}.user", allow_empty=True) or ""
        priority = check_str(c, item.get("priority"), f"{p}.priority", allow_empty=True) or ""
        limits = _limits(c, item.get("limits"), f"{p}.limits")
        if name and d is not None and tenant:
            ident = Identity(tenant=tenant, user=user, priority=priority, source="api_key", key_name=name,
                             limits=limits)
            out[d] = ApiKey(name, d, ident)
    if c.problems:
        raise ConfigError(c.problems)
    warnings = () if out else (f"{source}: no keys: every API key is refused",)
    return KeySet(MappingProxyType(out), source, digest, warnings, tuple(names))


def load_keys_file(path: str | Path) -> KeySet:
    return load_keys_bytes(read_config_file(path), str(path))
