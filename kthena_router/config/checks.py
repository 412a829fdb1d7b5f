"""Validation helpers shared by every config document kind (and the router configuration).

Each helper checks one value, records a problem on the collector when it is wrong
(naming the field path) and returns the value, or None / an empty value when it is
unusable, so that one pass reports every problem of a file.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from .duration import parse_duration
from .errors import ConfigProblem
from .model import DEFAULT_NAMESPACE, StringMatch

__all__ = [
    "Ctx", "ErrorSink", "check_duration", "check_enum", "check_int", "check_labels", "check_list",
    "check_mapping", "check_str", "check_string_match", "check_timestamp", "join_path", "refuse",
    "type_name",
]


class ErrorSink(Protocol):
    """Anything that collects problems by field path."""

    def err(self, path: str, message: str) -> None: ...


@dataclass
class Ctx:
    """Problem collector for one object; ``label`` names the document."""

    file: str
    label: str
    problems: list[ConfigProblem]

    def err(self, path: str, message: str, reason: str = "") -> None:
        self.problems.append(ConfigProblem(self.file, self.label, path, message, reason))


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def join_path(path: str, key: str) -> str:
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f'{path}["{key}"]'


def type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(v), type(v).__name__)


def refuse(c: ErrorSink, path: str, what: str) -> None:
    """A Kthena field this router does not enforce yet: refused at load, never ignored."""
    c.err(path, f"{what} is not supported yet; remove this field (the router refuses settings it would ignore)")


def check_mapping(
    c: ErrorSink, v: Any, path: str, known: Iterable[str], required: Iterable[str] = ()
) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping, got {type_name(v)}")
        return None
    known = tuple(known)
    for k in v:
        if not isinstance(k, str):
            c.err(path, f"keys must be strings, got {type_name(k)} {k!r}")
        elif k not in known:
            hint = difflib.get_close_matches(k, known, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else f" (known fields: {', '.join(known)})"
            c.err(join_path(path, k), f"unknown field{extra}")
    for k in required:
        if v.get(k) is None:
            c.err(join_path(path, k), "required field is missing")
    return v


def named_overrides(c: ErrorSink, raw: Any, path: str, kind: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """The entries of a router-configuration mapping of per-object overrides keyed "name"
    (namespace default) or "namespace/name": (key "namespace/name", field path, the entry as
    a mapping; null = {}). Bad keys and non-mapping entries are reported and skipped."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        c.err(path, f"must be a mapping of {kind} name to settings, got {type_name(raw)}")
        return
    for name, item in raw.items():
        p = join_path(path, str(name))
        if not isinstance(name, str) or not name or name.count("/") > 1 or name.startswith("/") \
                or name.endswith("/"):
            hint = " (YAML read this key as a boolean or number: quote it)" if not isinstance(name, str) else ""
            c.err(p, f"key must be {'an' if kind[0] in 'AEIOU' else 'a'} {kind} name or namespace/name{hint}")
            continue
        if item is None:
            item = {}
        if not isinstance(item, dict):
            c.err(p, f"must be a mapping, got {type_name(item)}")
            continue
        yield (name if "/" in name else f"{DEFAULT_NAMESPACE}/{name}"), p, item


def check_str(c: ErrorSink, v: Any, path: str, *, allow_empty: bool = False) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        c.err(path, f"must be a string, got {type_name(v)} {v!r}")
        return None
    if not allow_empty and not v:
        c.err(path, "must not be empty")
        return None
    return v


def check_int(c: ErrorSink, v: Any, path: str, lo: int, hi: int | None = None) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        c.err(path, f"must be an integer, got {type_name(v)} {v!r}")
        return None
    if v < lo or (hi is not None and v > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        c.err(path, f"must be {bound}, got {v}")
        return None
    return v


def check_enum(c: ErrorSink, v: Any, path: str, allowed: tuple[str, ...]) -> str | None:
    s = check_str(c, v, path)
    if s is not None and s not in allowed:
        c.err(path, f"must be one of {', '.join(allowed)}, got {s!r}")
        return None
    return s


def check_list(c: ErrorSink, v: Any, path: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        c.err(path, f"must be a list, got {type_name(v)}")
        return []
    return v


def check_labels(c: ErrorSink, v: Any, path: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping of strings, got {type_name(v)}")
        return {}
    out: dict[str, str] = {}
    for k, val in v.items():
        p = join_path(path, str(k))
        if not isinstance(k, str) or not k:
            c.err(p, "label names must be non-empty strings")
        elif not isinstance(val, str):
            c.err(p, f"must be a string (quote it in YAML), got {type_name(val)} {val!r}")
        else:
            out[k] = val
    return out


def check_string_match(c: ErrorSink, v: Any, path: str) -> StringMatch | None:
    m = check_mapping(c, v, path, ("exact", "prefix", "regex"))
    if m is None:
        return None
    set_keys = [k for k in ("exact", "prefix", "regex") if m.get(k) is not None]
    if len(set_keys) != 1:
        c.err(path, f"exactly one of exact, prefix, regex must be set, got {len(set_keys)}")
        return None
    k = set_keys[0]
    s = check_str(c, m[k], join_path(path, k), allow_empty=True)
    if s is None:
        return None
    if k == "regex":
        try:
            re.compile(s)
        except re.error as e:
            c.err(join_path(path, k), f"invalid regular expression {s!r}: {e}")
            return None
    return StringMatch(**{k: s})


def check_duration(c: ErrorSink, v: Any, path: str) -> float | None:
    if v is None:
        return None
    if not isinstance(v, str):
        c.err(path, f"must be a duration string like \"30s\" or \"1m30s\", got {type_name(v)} {v!r}")
        return None
    try:
        seconds = parse_duration(v)
    except ValueError as e:
        c.err(path, str(e))
        return None
    if seconds < 0:
        c.err(path, f"must not be negative, got {v!r}")
        return None
    return seconds


def positive_duration(c: ErrorSink, v: Any, path: str, default: float, lo: float | None = None,
                      hi: float | None = None) -> float:
    """A duration above 0 (within [lo, hi] when given, in seconds); `default` when absent, or
    when invalid (the error is recorded)."""
    if v is None:
        return default
    s = check_duration(c, v, path)
    if s is None:
        return default
    if lo is not None or hi is not None:
        low, high = lo or 0.0, hi if hi is not None else float("inf")
        if not low <= s <= high:
            c.err(path, f"must be between {low:g}s and {high:g}s, got {v!r}")
            return default
    elif s <= 0:
        c.err(path, f"must be greater than 0, got {v!r}")
        return default
    return s


def is_host_port(address: str) -> bool:
    """`host:port` with a port in 1..65535."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def check_timestamp(c: ErrorSink, v: Any, path: str) -> datetime | None:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v)
        except ValueError:
            c.err(path, f"must be an RFC 3339 timestamp like 2025-01-31T12:00:00Z, got {v!r}")
            return None
    if not isinstance(v, datetime):
        c.err(path, f"must be an RFC 3339 timestamp, got {type_name(v)} {v!r}")
        return None
    return v if v.tzinfo is not None else v.replace(tzinfo=timezone.utc)
