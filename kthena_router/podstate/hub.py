"""The pod-state hub: one process per router pod (a child of the supervisor) that scrapes
and probes every engine once, whatever the worker count, and relays prefix-index inserts
and in-flight changes.

- Workers connect to its unix socket (0600, in the router's runtime dir) and send their
  endpoint sets (TARGETS); the hub scrapes and probes the union over its live workers.
- Every engine snapshot (SNAPSHOT) and every probe round (PROBES) goes to every worker.
- A worker's dispatch-time inserts (INSERTS) go, as received, to every other worker, and
  into a bounded replay log that a worker (re)connecting gets first, so a restarted
  worker starts with the pod's index rather than an empty one.
- A worker's attempt starts and ends per endpoint (FLIGHT) go to every other worker, for
  their least-request load between scrapes; not replayed (the next scrape supersedes them).
- Writes never wait: a worker whose socket buffer is full misses frames (counted) rather
  than slowing the hub for the others.
The hub exits when its parent (the supervisor) is gone. Its metrics: hub_metrics.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.config
import os
import signal
import ssl
import time
from collections import deque
from typing import Any

import aiohttp

from kthena_router.engine_state.scraper import EngineStateScraper
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import ensure_multiprocess
from kthena_router.settings import RouterSettings

from . import wire
from .hub_metrics import HubMetrics, count_records
from .kv_relay import HubKvSink, hub_sources

log = logging.getLogger(__name__)

SEND_BUFFER_LIMIT = 8 * 1024 * 1024  # bytes queued to one worker before frames are dropped
REPLAY_LIMIT = 32 * 1024 * 1024  # insert bytes kept for workers that (re)connect
PARENT_CHECK_S = 1.0


class _Conn:
    __slots__ = ("writer", "pid", "targets", "dropped")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pid = 0
        self.targets = wire.Targets()
        self.dropped = 0


class Hub:
    def __init__(self, settings: RouterSettings, path: str, metrics: HubMetrics | None = None) -> None:
        self.settings = settings
        self.path = path
        self.metrics = metrics if metrics is not None else HubMetrics()
        self.conns: list[_Conn] = []
        self.scraper: EngineStateScraper | None = None
        self.probe_targets: dict[str, wire.ProbeTarget] = {}
        self.probe_results: dict[str, bool] = {}
        self.replay: deque[bytes] = deque()
        self.replay_bytes = 0
        self.probes_sent = 0  # GET /health requests made (debugging, tests)
        self.kv = HubKvSink(self._broadcast, on_up=self.metrics.kv_streams_up.set)
        self.kv_subs: Any = None  # KvEventSubscribers, at the first KV-event source
        self._session: aiohttp.ClientSession | None = None
        self._insecure = ssl.create_default_context()
        self._insecure.check_hostname = False
        self._insecure.verify_mode = ssl.CERT_NONE

    # --- fan-out ---------------------------------------------------------------------------
    def _send(self, conn: _Conn, data: bytes) -> None:
        transport = conn.writer.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > SEND_BUFFER_LIMIT:
            conn.dropped += 1
            self.metrics.dropped.inc()
            if conn.dropped == 1 or conn.dropped % 1000 == 0:
                log.warning("pod-state hub: worker %d is not reading; %d frames dropped", conn.pid, conn.dropped)
            return
        conn.writer.write(data)
        self.metrics.sent(data)

    def _broadcast(self, data: bytes, skip: _Conn | None = None) -> None:
        for conn in self.conns:
            if conn is not skip and conn.pid:
                self._send(conn, data)

    def _on_snapshot(self, snap: EndpointSnapshot) -> None:
        (self.metrics.scrape_failed if snap.stale else self.metrics.scrape_ok).inc()
        self._broadcast(wire.frame(wire.SNAPSHOT, wire.encode_snapshot(snap)))

    def _on_inserts(self, conn: _Conn, payload: bytes) -> None:
        self._broadcast(wire.frame(wire.INSERTS, payload), skip=conn)
        self.replay.append(payload)
        self.replay_bytes += len(payload)
        while self.replay_bytes > REPLAY_LIMIT:
            self.replay_bytes -= len(self.replay.popleft())
        self.metrics.inserts.inc(count_records(payload))
        self.metrics.replay_bytes.set(self.replay_bytes)

    def _welcome(self, conn: _Conn) -> None:
        """What a (re)started worker needs: snapshots, health verdicts, the index so far."""
        if self.scraper is not None:
            for snap in self.scraper.all().values():
                self._send(conn, wire.frame(wire.SNAPSHOT, wire.encode_snapshot(snap)))
        if self.probe_results:
            self._send(conn, wire.frame(wire.PROBES, wire.encode_probes(self.probe_results.items())))
        for payload in self.replay:
            self._send(conn, wire.frame(wire.INSERTS, payload))
        kv = self.kv.welcome()
        if kv is not None:
            self._send(conn, kv)

    # --- endpoint sets -----------------------------------------------------------------------
    def _retarget(self) -> None:
        """Serve the union of the live workers' sets; with no worker left keep the last one
        (a restarting worker comes back to warm state)."""
        live = [c for c in self.conns if c.pid]
        self.metrics.workers.set(len(live))
        if not live:
            return
        probe: dict[str, wire.ProbeTarget] = {}
        scrape: dict[str, wire.ScrapeSpec] = {}
        kv: dict[str, wire.KvSpec] = {}
        for c in live:
            probe.update((t.key, t) for t in c.targets.probe)
            scrape.update((s.key, s) for s in c.targets.scrape)
            kv.update((s.key, s) for s in c.targets.kv)
        self.probe_targets = probe
        for key in [k for k in self.probe_results if k not in probe]:
            del self.probe_results[key]
        if self.scraper is not None:
            self.scraper.set_endpoints((s.key, s.base_url, s.flavour) for s in scrape.values())
        if kv and self.kv_subs is None:
            from kthena_router.kv_events.subscriber import KvEventSubscribers  # zmq: only when used

            self.kv_subs = KvEventSubscribers(self.kv)
        if self.kv_subs is not None:
            self.kv_subs.set_sources(hub_sources(kv.values()))
            self.kv.forget(kv)
        m = self.metrics.engines
        m.labels("probe").set(len(probe))
        m.labels("scrape").set(len(scrape))
        m.labels("kv_events").set(len(kv))

    # --- connections ---------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        self.conns.append(conn)
        try:
            while True:
                size, kind = wire.parse_header(await reader.readexactly(wire.HEADER.size))
                payload = await reader.readexactly(size)
                if kind == wire.INSERTS:
                    self._on_inserts(conn, payload)
                elif kind == wire.FLIGHT:  # relayed as is; a scrape makes it stale, no replay
                    self._broadcast(wire.frame(wire.FLIGHT, payload), skip=conn)
                elif kind == wire.TARGETS:
                    conn.targets = wire.decode_targets(payload)
                    self._retarget()
                elif kind == wire.HELLO:
                    conn.pid = int(wire.decode_hello(payload).get("pid", 0)) or -1
                    self._welcome(conn)
                    self.metrics.workers.set(sum(1 for c in self.conns if c.pid))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except wire.decode_error() as exc:
            log.warning("pod-state hub: bad frame from worker %d, closing: %s", conn.pid, exc)
        finally:
            self.conns.remove(conn)
            self._retarget()
            writer.close()

    # --- probing -----------------------------------------------------------------------------
    async def _probe(self, session: aiohttp.ClientSession, t: wire.ProbeTarget) -> tuple[str, bool]:
        ssl_arg: Any = {wire.SSL_NONE: None, wire.SSL_VERIFY: True, wire.SSL_INSECURE: self._insecure}[t.ssl]
        self.probes_sent += 1
        try:
            async with session.get(t.base_url + "/health", headers=dict(t.headers), ssl=ssl_arg,
                                   timeout=aiohttp.ClientTimeout(total=self.settings.health_probe_timeout_s)) as r:
                await r.read()
                return t.key, r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return t.key, False

    async def _probe_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.settings.health_probe_interval_s)
            targets = list(self.probe_targets.values())
            if not targets:
                continue
            try:
                results = await asyncio.gather(*(self._probe(session, t) for t in targets))
            except Exception:  # a probe round must never end the loop
                log.exception("pod-state hub: probe round failed")
                continue
            for key, ok in results:
                (self.metrics.probe_ok if ok else self.metrics.probe_failed).inc()
                if key in self.probe_targets:
                    self.probe_results[key] = ok
            self._broadcast(wire.frame(wire.PROBES, wire.encode_probes(results)))

    # --- main --------------------------------------------------------------------------------
    async def serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.settings.upstream_pool_size, limit_per_host=0),
            auto_decompress=False, skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        tasks: list[asyncio.Task[None]] = []
        if self.settings.router_config_path:  # scraping serves the scheduler only
            self.scraper = EngineStateScraper(session, self.settings.scrape_interval_s, on_update=self._on_snapshot)
            tasks.append(asyncio.create_task(self.scraper.run()))
        tasks.append(asyncio.create_task(self._probe_forever(session)))
        old_umask = os.umask(0o177)  # the socket is born 0600: only the router's user connects
        try:
            server = await asyncio.start_unix_server(self._handle, self.path)
        finally:
            os.umask(old_umask)
        log.info("pod-state hub serving %s", self.path)
        parent = os.getppid()
        try:
            while os.getppid() == parent:  # orphaned (supervisor killed): exit
                await asyncio.sleep(PARENT_CHECK_S)
        finally:
            server.close()
            for conn in list(self.conns):  # workers see EOF now, not at process exit
                conn.writer.close()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.kv_subs is not None:
                await self.kv_subs.close()
            await session.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def main(settings_json: str, path: str, log_config: dict[str, Any]) -> None:
    """Entry point of the hub process (multiprocessing spawn target)."""
    logging.config.dictConfig(log_config)
    settings = RouterSettings.from_json(settings_json)
    ensure_multiprocess(settings.prometheus_dir)  # its metrics reach the admin's /metrics
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the supervisor's to handle
    started = time.monotonic()
    try:
        asyncio.run(Hub(settings, path).serve())
    except KeyboardInterrupt:
        pass
    log.info("pod-state hub exits after %.0fs", time.monotonic() - started)
