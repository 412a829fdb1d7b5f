"""Failure knobs of one simulated engine, settable at start and through the admin port."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, fields
from typing import Any


class FaultError(ValueError):
    """A fault specification that is not valid (unknown key, wrong type or range)."""


@dataclass
class Faults:
    error_rate: float = 0.0              # answer error_status before any byte, this often
    error_status: int = 500
    refuse_connections: bool = False     # listening socket closed; open connections reset
    die_after_tokens: int | None = None  # abort the TCP connection after N content chunks
    stall: bool = False                  # accept the request, never answer
    stall_after_tokens: int | None = None  # after N content chunks: keep the connection, send nothing
    token_delay_s: float = 0.0           # extra wait before each token (a slow, progressing stream)
    first_byte_delay_s: float = 0.0      # wait before the response starts
    garbage: bool = False                # 200 with broken SSE lines / invalid JSON
    slow_start_s: float = 0.0            # /health and completions 503 for this long
    slow_start_until: float = 0.0        # monotonic deadline derived from slow_start_s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("slow_start_until")
        d["slow_start_remaining_s"] = max(0.0, self.slow_start_until - time.monotonic())
        return d

    def starting(self) -> bool:
        return self.slow_start_until > time.monotonic()

    def roll_error(self, rng: random.Random) -> bool:
        return self.error_rate > 0 and rng.random() < self.error_rate

    def merge(self, patch: Any) -> None:
        """Apply a partial JSON object (validated first: nothing changes on error)."""
        if not isinstance(patch, dict):
            raise FaultError("faults must be a JSON object")
        known = {f.name for f in fields(self)} - {"slow_start_until"}
        new: dict[str, Any] = {}
        for key, value in patch.items():
            if key not in known:
                raise FaultError(f"unknown fault {key!r}; known: {', '.join(sorted(known))}")
            new[key] = _check(key, value)
        for key, value in new.items():
            setattr(self, key, value)
        if "slow_start_s" in new:
            self.slow_start_until = time.monotonic() + new["slow_start_s"]


def _check(key: str, value: Any) -> Any:
    def number(lo: float, hi: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultError(f"{key} must be a number")
        if value < lo or (hi is not None and value > hi):
            raise FaultError(f"{key} must be in [{lo}, {hi if hi is not None else 'inf'}]")
        return float(value)

    if key == "error_rate":
        return number(0.0, 1.0)
    if key in ("first_byte_delay_s", "slow_start_s", "token_delay_s"):
        return number(0.0)
    if key == "error_status":
        if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
            raise FaultError("error_status must be an integer HTTP status in 400..599")
        return value
    if key in ("die_after_tokens", "stall_after_tokens"):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FaultError(f"{key} must be a non-negative integer or null")
        return value
    if not isinstance(value, bool):
        raise FaultError(f"{key} must be true or false")
    return value


def parse_fault_spec(spec: Any, n_engines: int) -> list[Faults]:
    """`{"*": {...}, "0": {...}}` -> one Faults per engine ("*" first, then per index)."""
    if not isinstance(spec, dict):
        raise FaultError("--faults must be a JSON object keyed by engine index or '*'")
    out = [Faults() for _ in range(n_engines)]
    for key in spec:
        if key != "*" and not (key.isdigit() and int(key) < n_engines):
            raise FaultError(f"--faults key {key!r} is not '*' or an engine index < {n_engines}")
    if "*" in spec:
        for f in out:
            f.merge(spec["*"])
    for key, patch in spec.items():
        if key != "*":
            out[int(key)].merge(patch)
    return out
