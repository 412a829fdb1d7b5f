"""Admin port: fault knobs, request accounting and engine state of every simulated engine.

Engine index `*` in a path applies a POST to every engine (GET answers a list).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from .faults import FaultError
from .http_errors import error_response, json_response
from .server import EngineServer


def make_admin_app(servers: list[EngineServer], publishers: list[list[Any]] | None = None) -> web.Application:
    """publishers[i]: engine i's KV-event publishers (one per DP rank), when events are on."""
    app = web.Application()

    def targets(request: web.Request) -> list[EngineServer]:
        i = request.match_info["i"]
        if i == "*":
            return servers
        if not i.isdigit() or int(i) >= len(servers):
            raise web.HTTPNotFound(text=f"no engine {i!r}; engines are 0..{len(servers) - 1}")
        return [servers[int(i)]]

    def answer(request: web.Request, items: list[Any]) -> web.Response:
        return json_response(items if request.match_info["i"] == "*" else items[0])

    async def engines(request: web.Request) -> web.Response:
        return json_response([s.summary() for s in servers])

    async def get_faults(request: web.Request) -> web.Response:
        return answer(request, [s.faults.to_json() for s in targets(request)])

    async def post_faults(request: web.Request) -> web.Response:
        ts = targets(request)
        try:
            patch = orjson.loads(await request.read() or b"{}")
            for s in ts:  # validate against a copy first so that nothing half-applies
                s.faults.__class__(**vars(s.faults)).merge(patch)
            for s in ts:
                await s.apply_faults(patch)
        except (orjson.JSONDecodeError, FaultError) as e:
            return error_response(400, str(e))
        return answer(request, [s.faults.to_json() for s in ts])

    async def reset_faults(request: web.Request) -> web.Response:
        ts = targets(request)
        for s in ts:
            await s.reset_faults()
        return answer(request, [s.faults.to_json() for s in ts])

    async def get_requests(request: web.Request) -> web.Response:
        limit = request.query.get("limit")
        n = int(limit) if limit is not None and limit.isdigit() else None
        return answer(request, [s.requests.to_json(n) for s in targets(request)])

    async def reset_requests(request: web.Request) -> web.Response:
        ts = targets(request)
        for s in ts:
            s.requests.reset()
            if s.pd is not None:
                s.pd.reset_counters()
        return answer(request, [s.requests.to_json() for s in ts])

    async def state(request: web.Request) -> web.Response:
        return answer(request, [s.state() for s in targets(request)])

    async def cache(request: web.Request) -> web.Response:
        """The engines' true cache content as KV-event block hashes (one entry per DP rank)."""
        out = []
        for s in targets(request):
            pubs = (publishers or [])[s.cfg.index] if publishers else []
            if not pubs:
                return error_response(404, "KV events are off (start with --kv-events-port-base)")
            out.append([p.cache_content() for p in pubs])
        return answer(request, out)

    async def stop_kv_events(request: web.Request) -> web.Response:
        """Stop publishing KV events (sockets closed: subscribers see the stream drop);
        for tests of a router's fallback. Not reversible."""
        stopped = 0
        for s in targets(request):
            for p in (publishers or [])[s.cfg.index] if publishers else []:
                await p.close()
                stopped += 1
        return json_response({"stopped": stopped})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    routes: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
        ("GET", "/admin/engines", engines),
        ("GET", "/admin/engines/{i}/faults", get_faults),
        ("POST", "/admin/engines/{i}/faults", post_faults),
        ("POST", "/admin/engines/{i}/faults/reset", reset_faults),
        ("GET", "/admin/engines/{i}/requests", get_requests),
        ("POST", "/admin/engines/{i}/requests/reset", reset_requests),
        ("GET", "/admin/engines/{i}/state", state),
        ("GET", "/admin/engines/{i}/cache", cache),
        ("POST", "/admin/engines/{i}/kv_events/stop", stop_kv_events),
        ("GET", "/admin/health", health),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app
