"""Per-engine request accounting, read by the router's tests through the admin port.

Each request gets one log entry; its `status` moves from `running` to a final value:
completed | aborted (client went away) | errored (error/garbage/slow-start fault) |
died (die_after_tokens) | stalled (still stalled, client still connected) |
rejected (4xx: bad request, unknown model). Counters are kept per current status.
"""

from __future__ import annotations

from collections import deque
from typing import Any

STATUSES = ("running", "completed", "aborted", "errored", "died", "stalled", "rejected")
MAX_LOG = 100_000  # bound memory during long benchmarks; counters stay exact


class RequestLog:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.received = 0
        self.counts = dict.fromkeys(STATUSES, 0)
        self.log: deque[dict[str, Any]] = deque(maxlen=MAX_LOG)

    def add(self, request_id: str | None, path: str, headers: dict[str, str]) -> dict[str, Any]:
        entry = {
            "request_id": request_id, "path": path, "model": None, "stream": False,
            "status": "running", "tokens_out": 0, "http_status": None, "fault": None,
            "headers": headers, "tcp_nodelay": None, "pd": None,
        }
        self.received += 1
        self.counts["running"] += 1
        self.log.append(entry)
        return entry

    def set_status(self, entry: dict[str, Any], status: str) -> None:
        old = entry["status"]
        if old == status:
            return
        self.counts[old] -= 1
        self.counts[status] += 1
        entry["status"] = status

    def to_json(self, limit: int | None = None) -> dict[str, Any]:
        log = list(self.log) if limit is None else list(self.log)[-limit:] if limit else []
        return {"received": self.received, **self.counts, "log": log}
