"""API keys files and router configurations with `auth`, for tests of every part that keys
on identity (rate limits, fairness, session stickiness).

    keys = {"sk-alice": api_key("alice", tenant="acme", user="alice", priority="high")}
    write_keys_file(tmp / "keys.yaml", keys)
    rc = write_router_config(tmp / "router.yaml", auth_section(tmp / "keys.yaml"))
    client = openai.OpenAI(base_url=router.openai_url, api_key="sk-alice", max_retries=0)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml


def api_key(name: str, *, tenant: str, user: str = "", priority: str = "",
            limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """One entry of a keys file, without its sha256 (write_keys_file adds it)."""
    entry: dict[str, Any] = {"name": name, "tenant": tenant}
    if user:
        entry["user"] = user
    if priority:
        entry["priority"] = priority
    if limits is not None:
        entry["limits"] = limits
    return entry


def keys_file_text(keys: dict[str, dict[str, Any]]) -> str:
    """{plain key: api_key(...)} -> the YAML of a keys file (hashes only)."""
    entries = [{**e, "sha256": hashlib.sha256(k.encode()).hexdigest()} for k, e in keys.items()]
    return yaml.safe_dump({"keys": entries}, sort_keys=False)


def write_text(path: Path, text: str) -> Path:
    """Atomic replace (rename), as editors and ConfigMap updates do."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_keys_file(path: Path, keys: dict[str, dict[str, Any]]) -> Path:
    return write_text(path, keys_file_text(keys))


def auth_section(keys_file: Path | None = None, **jwt: Any) -> dict[str, Any]:
    """The router configuration's `auth` mapping: apiKeysFile and/or JWT settings by their
    YAML names (issuer=..., audiences=[...], jwksUri=..., clockSkewSeconds=...)."""
    out: dict[str, Any] = dict(jwt)
    if keys_file is not None:
        out["apiKeysFile"] = str(keys_file)
    return out


def write_router_config(path: Path, auth: dict[str, Any], **sections: Any) -> Path:
    return write_text(path, yaml.safe_dump({"auth": auth, **sections}, sort_keys=False))
