"""The upstream HTTP client: one aiohttp ClientSession per worker, pooled keep-alive.

aiohttp sets TCP_NODELAY on every connection it opens (aiohttp.base_protocol,
`tcp_nodelay(transport, True)` in connection_made). Responses are not decompressed:
engine bytes are relayed as they are.
"""

from __future__ import annotations

import aiohttp

from kthena_router.settings import RouterSettings

KEEPALIVE_S = 75.0


class UpstreamPool:
    """Owns the worker's ClientSession; created in the app lifespan, closed at shutdown."""

    def __init__(self, settings: RouterSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._settings.upstream_pool_size,
            limit_per_host=0,  # the total limit is the only bound
            keepalive_timeout=KEEPALIVE_S,
            ttl_dns_cache=60,  # targets are IPs already; names only for TLS hosts
            enable_cleanup_closed=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            # Only the client's headers go upstream; no aiohttp defaults (User-Agent ...).
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._settings.connect_timeout_s),
            read_bufsize=2 ** 16,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("upstream pool not started")
        return self._session

    def timeout(self, first_byte_s: float | None) -> aiohttp.ClientTimeout:
        """Connect bound plus a read-idle bound: the first byte (and any later gap) within
        `first_byte_s`; a long generation that keeps sending is never cut."""
        return aiohttp.ClientTimeout(total=None, sock_connect=self._settings.connect_timeout_s,
                                     sock_read=first_byte_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
