"""Increments of prometheus_client values, many at once (front/batch.py's flush).

In multiprocess mode a value's `inc` takes the values' lock, checks the pid (a fork resets
every value), adds, and packs value and timestamp into the mmap file. Per call that is
about 1 µs of Python, and a fast-path request's flush has up to ~20 of them. Here a whole
batch runs under one acquisition of that same lock and one pid check, each increment being
the add and the pack `inc` does (same file position, same bytes). prometheus_client's
internals are reached through the closure of its value class; anything unexpected (another
version's layout, a fork since the last write, a non-multiprocess value) takes `inc`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.mmap_dict import _pack_two_doubles

_Internals = tuple[Any, dict[str, Any], Callable[[], int]]  # (lock, pid cell, process_identifier)
_known: dict[type, _Internals | None] = {}


def _closure(fn: Any) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    return dict(zip(code.co_freevars, (c.cell_contents for c in cells)))


def _internals(cls: type) -> _Internals | None:
    """(lock, pid dict, process_identifier) of a multiprocess value class; None otherwise."""
    if cls in _known:
        return _known[cls]
    found: _Internals | None = None
    if getattr(cls, "_multiprocess", False):
        lock = _closure(cls.__dict__.get("inc")).get("lock")
        check = _closure(cls.__dict__.get(f"_{cls.__name__}__check_for_pid_change"))
        pid, ident = check.get("pid"), check.get("process_identifier")
        if (lock is not None and hasattr(lock, "__enter__") and isinstance(pid, dict) and "value" in pid
                and callable(ident)):
            found = (lock, pid, ident)
    _known[cls] = found
    return found


def write_values(todo: list[tuple[Any, float]]) -> None:
    """`value.inc(amount)` for each pair, in order."""
    cls = type(todo[0][0])
    internals = _internals(cls)
    if internals is None:
        for value, amount in todo:
            value.inc(amount)
        return
    lock, pid, ident = internals
    if pid["value"] != ident():  # forked: inc() resets every value first
        for value, amount in todo:
            value.inc(amount)
        return
    others: list[tuple[Any, float]] = []
    with lock:
        for value, amount in todo:
            if type(value) is not cls:
                others.append((value, amount))
                continue
            value._value += amount
            value._timestamp = 0.0
            f = value._file
            pos = f._positions.get(value._key)
            if pos is None:  # not in the file yet (never so for a value read at creation)
                f.write_value(value._key, value._value, 0.0)
            else:
                _pack_two_doubles(f._m, pos, value._value, 0.0)
    for value, amount in others:
        value.inc(amount)
