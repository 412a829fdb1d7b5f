"""Per-worker debug endpoints on a unix socket, relayed by the admin server.

Debug views (e.g. the KV-event ownership table) live in the workers, while the admin port
belongs to the parent. Each worker serves them on `<runtime_dir>/debug/<pid>.sock`
(mode 0600, inside the router's own runtime dir), so they never appear on the client
port and only the router's user can reach them; the admin server relays
`GET /debug/<view>` to every worker (or `?pid=N` to one).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

DEBUG_SUBDIR = "debug"
_MAX_UNIX_PATH = 100  # sun_path is 108 bytes on Linux

View = Callable[[], dict[str, Any] | None]  # None: the view does not exist in this worker


def socket_path(runtime_dir: str, pid: int) -> str:
    return str(Path(runtime_dir) / DEBUG_SUBDIR / f"{pid}.sock")


class DebugServer:
    """One worker's debug views on its unix socket (started in the app lifespan)."""

    def __init__(self, runtime_dir: str, views: dict[str, View]) -> None:
        self.path = socket_path(runtime_dir, os.getpid()) if runtime_dir else ""
        self.views = views
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        if not self.path:
            return
        if len(self.path.encode()) > _MAX_UNIX_PATH:
            log.warning("debug socket path too long (%s); /debug views of worker %d are unavailable",
                        self.path, os.getpid())
            return
        Path(self.path).parent.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        app = web.Application()
        app.router.add_get("/debug/{view}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, self.path).start()
        os.chmod(self.path, 0o600)  # the debug dir is 0700 already; belt and braces

    async def _handle(self, request: web.Request) -> web.Response:
        view = self.views.get(request.match_info["view"])
        body = view() if view is not None else None
        if body is None:
            return web.json_response({"error": {"message": f"no such debug view: {request.path}",
                                                "type": "NotFoundError", "param": None, "code": 404}},
                                     status=404)
        return web.json_response(body)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
