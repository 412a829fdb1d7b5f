"""JSON merge patches (RFC 7386) carrying only what changed: `diff(old, new)` is the patch
that turns `old` into `new` (a removed key is set to null, objects are diffed key by key,
anything else, lists included, is replaced whole as merge patches do)."""

from __future__ import annotations

from typing import Any

__all__ = ["diff"]


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in old.keys() - new.keys():
        out[k] = None
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif isinstance(v, dict) and isinstance(old[k], dict):
            sub = diff(old[k], v)
            if sub:
                out[k] = sub
        elif v != old[k] or type(v) is not type(old[k]):
            out[k] = v
    return out
