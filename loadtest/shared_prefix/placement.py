"""Where each prefix group was served, read back from the engines (issue 15's "explain a
peer's win with per-engine figures").

The client tags every request `x-request-id: bench-<index>` (client.py); routers pass the
header on (ours keeps a client's id; a router that replaces it leaves the figures empty,
which the cell records as 0 requests seen). Each engine's request log (the simulator's
`GET /admin/engines/*/requests`) then says which engine served which request, and so
which groups each engine held.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from loadtest.procs import http

ID_PREFIX = "bench-"


def request_id(index: int) -> str:
    return f"{ID_PREFIX}{index}"


def served_by(engine_logs: list[dict[str, Any]]) -> dict[int, int]:
    """Request index -> engine, from the engines' request logs (one dict per engine)."""
    out: dict[int, int] = {}
    for engine, log in enumerate(engine_logs):
        for entry in log.get("log", []):
            rid = entry.get("request_id") or ""
            if rid.startswith(ID_PREFIX) and rid[len(ID_PREFIX):].isdigit():
                out[int(rid[len(ID_PREFIX):])] = engine
    return out


def group_figures(served: dict[int, int], group_of: dict[int, int], n: int) -> dict[str, Any]:
    """Per engine: the distinct groups it served and the groups it was home to (served most
    of their requests); overall: groups served by more than one engine; per group: its
    requests on each engine (which groups shared an engine decides `bursts`' tail) and the
    engines of its requests in request order (where a session's turn moved, on `multiturn`)."""
    per_group: dict[int, Counter[int]] = {}
    order: dict[int, list[int]] = {}
    for index, engine in sorted(served.items()):
        per_group.setdefault(group_of[index], Counter())[engine] += 1
        order.setdefault(group_of[index], []).append(engine)
    groups_served = [sum(1 for c in per_group.values() if c[e]) for e in range(n)]
    homes = Counter(c.most_common(1)[0][0] for c in per_group.values())
    return {"requests_seen": len(served), "groups_served": groups_served,
            "groups_homed": [homes[e] for e in range(n)],
            "groups_split": sum(1 for c in per_group.values() if len(c) > 1),
            "per_group": {str(g): [c[e] for e in range(n)] for g, c in sorted(per_group.items())},
            "order": {str(g): o for g, o in sorted(order.items())}}


def read(admin_url: str, group_of: dict[int, int], n: int) -> dict[str, Any]:
    status, data = http("GET", f"{admin_url}/admin/engines/*/requests")
    if status != 200:
        return {"requests_seen": 0, "error": f"HTTP {status}"}
    return group_figures(served_by(json.loads(data)), group_of, n)
