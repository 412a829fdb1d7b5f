"""Two-hop dispatch of a PD ModelServer's requests (docs/pd-dispatch.md).

The pairer (pairing.py) proposes pairs, best first; each pair is tried as a whole:
- http, lmcache, nixl, mooncake: the prefill hop (prefill_hop.py), then the decode hop;
- bootstrap (SGLang): both hops at once; a failed decode cancels its prefill, a failed
  prefill cancels its decode (which would otherwise wait for KV that never comes);
- a pair without prefill (the pairer's conditional disaggregation): the decode hop alone.

The decode hop is an ordinary executor attempt (executor.py: timeouts of the server's
traffic settings, relays, usage and rate-limit accounting, health feedback) whose
scheduling feedback goes to the pairer's decode side, and whose stream fails, not commits,
when its first event is an error event (vLLM's report of a failed KV load). A failure
before the first byte reaches the client moves to the next pair; after it, never (the
stream ends with an error event, as on the one-hop path). A failed prefill is never followed
by its decode, so no decode recomputes the prompt in silence. Client disconnect: the
request task is cancelled; every hop's connection is closed, so both engines abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from kthena_router.config.model import SGLANG_BOOTSTRAP
from kthena_router.config.traffic import ServerTraffic
from kthena_router.endpoints.health import Failure
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.executor import Executor
from kthena_router.proxy.relay import AttemptFailure, Exchange
from kthena_router.proxy.relay_sse import SseStreamRelay
from kthena_router.proxy.upstream import UpstreamPool
from kthena_router.routing.table import RouteMatch
from kthena_router.settings import RouterSettings

from .config import PdServerSettings
from .connectors import KV_PARAMS_CONNECTORS, HopBodies
from .metrics import PdMetrics
from .pairing import PdPair
from .prefill_hop import PrefillOutcome, prefill_hop
from .topology import PdTopology

__all__ = ["PdDispatcher"]

TWO_HOP = "two_hop"
DECODE_ONLY = "decode_only"


class _DecodeSide:
    """The executor's scheduler feedback, sent to the pairer's decode side."""

    __slots__ = ("pairer",)

    def __init__(self, pairer: Any) -> None:
        self.pairer = pairer

    def dispatched(self, ep: EndpointState, info: Any) -> None:
        self.pairer.dispatched(ep, info, "decode")

    def finished(self, ep: EndpointState, ttft_s: float | None, tpot_s: float | None,
                 info: Any = None) -> None:
        self.pairer.finished(ep, "decode", ttft_s, tpot_s, info)

    def observe_prompt_tokens(self, info: Any, n: int) -> None:
        self.pairer.observe_prompt_tokens(info, n)


class _Failed:
    __slots__ = ("side", "ep", "failure")

    def __init__(self, side: str, ep: EndpointState, failure: AttemptFailure) -> None:
        self.side = side
        self.ep = ep
        self.failure = failure


class PdDispatcher:
    """Per worker."""

    def __init__(self, settings: RouterSettings, executor: Executor, pool: UpstreamPool,
                 metrics: RouterMetrics, pd_metrics: PdMetrics) -> None:
        self.settings = settings
        self.executor = executor
        self.pool = pool
        self.metrics = metrics
        self.pd_metrics = pd_metrics
        self.decode_relay = SseStreamRelay(error_first_fails=True)
        self._side: _DecodeSide | None = None

    def _feedback(self, pairer: Any) -> _DecodeSide:
        side = self._side
        if side is None or side.pairer is not pairer:  # the pairer is replaced on reconfiguration
            side = self._side = _DecodeSide(pairer)
        return side

    async def run(self, x: Exchange, pairer: Any, bodies: HopBodies, match: RouteMatch, topo: PdTopology,
                  info: Any, head: bytes, headers: bytes, traffic: ServerTraffic, pd: PdServerSettings,
                  preferred: EndpointState | None) -> None:
        """Deliver a response to the client, or raise RequestError (nothing sent yet)."""
        server = match.server
        loop = asyncio.get_running_loop()
        x.apply_limits(traffic.timeouts, traffic.max_buffered_response_bytes, loop.time())
        if topo.problem is not None:
            raise RequestError(503, f"{topo.problem}; no prefill/decode pair can serve `{x.model_label}`",
                               code="pd_unavailable")
        if info is not None:
            await pairer.prepare(info)
        pairs = pairer.pairs(topo, info, pd)
        bootstrap = topo.connector == SGLANG_BOOTSTRAP
        if bootstrap:  # an SGLang decode engine cannot serve without its prefill peer
            pairs = [p for p in pairs if p.prefill is not None]
        if not pairs:
            raise RequestError(503, f"ModelServer {x.server_label}: no prefill/decode pair available for "
                                    f"`{x.model_label}`", code="pd_unavailable")
        pairs = _order(pairs, preferred)
        if server.retry_attempts is not None:  # explicit policy, 0 = no retry
            budget = 1 + server.retry_attempts
        else:
            budget = min(self.settings.default_retry_endpoints, len(pairs))
        feedback = self._feedback(pairer)
        failed: set[str] = set()
        last: _Failed | None = None
        tried = 0
        mode = ""
        try:
            for pair in pairs:
                if tried >= budget:
                    break
                if pair.decode.key in failed or (pair.prefill is not None and pair.prefill.key in failed):
                    continue  # one failure per endpoint and request is enough
                if tried:
                    if x.deadline is not None and loop.time() + server.retry_interval_s >= x.deadline:
                        break
                    self.metrics.retry(x.server_label)
                    if server.retry_interval_s > 0:
                        await asyncio.sleep(server.retry_interval_s)
                tried += 1
                mode = TWO_HOP if pair.prefill is not None else DECODE_ONLY
                # per-endpoint token counts: the prompt was computed by the prefill endpoint
                x.input_endpoint = "" if pair.prefill is None else pair.prefill.key
                if pair.prefill is None:
                    res = await self._decode(x, feedback, info, pair.decode, head, headers, bodies.plain_decode, "")
                elif bootstrap:
                    res = await self._concurrent(x, pairer, feedback, info, pair, bodies, head, headers, pd)
                else:
                    res = await self._sequential(x, pairer, feedback, info, pair, bodies, head, headers, pd,
                                                 topo.connector)
                if res is None or x.committed:
                    return
                failed.add(res.ep.key)
                last = res
        finally:
            if mode:
                pdm = self.pd_metrics
                pdm.request(x.server_label, x.model_label, mode)
                if x.ttft is not None and x.status == 200:
                    pdm.observe_ttft(x.server_label, x.model_label, mode, x.ttft)
        if last is None:
            raise RequestError(503, f"ModelServer {x.server_label}: no prefill/decode pair available for "
                                    f"`{x.model_label}`", code="pd_unavailable")
        f = last.failure
        what = f"{last.side} hop on {last.ep.key} failed: {f.detail}; {tried} prefill/decode pair(s) tried"
        if f.failure is Failure.TIMEOUT:
            raise RequestError(504, f"upstream timed out ({what})", code=504)
        raise RequestError(502, f"upstream request failed ({what})", code=502)

    # --- one pair -----------------------------------------------------------------------

    async def _sequential(self, x: Exchange, pairer: Any, feedback: _DecodeSide, info: Any, pair: PdPair,
                          bodies: HopBodies, head: bytes, headers: bytes, pd: PdServerSettings,
                          connector: str) -> _Failed | None:
        prefill = pair.prefill
        assert prefill is not None
        x.endpoint_label = prefill.key
        out = await prefill_hop(x, self.pool, self.metrics, self.pd_metrics, pairer, info, prefill, head, headers,
                                bodies.prefill, pd.prefill_timeout_s,
                                bodies.decode_with_kv if connector in KV_PARAMS_CONNECTORS else None)
        if out.failure is not None:
            return _Failed("prefill", prefill, out.failure)
        if out.status >= 400:
            await _answer(x, out)
            return None
        body = out.decode_body if out.decode_body is not None else bodies.plain_decode
        return await self._decode(x, feedback, info, pair.decode, head, headers, body, connector)

    async def _concurrent(self, x: Exchange, pairer: Any, feedback: _DecodeSide, info: Any, pair: PdPair,
                          bodies: HopBodies, head: bytes, headers: bytes, pd: PdServerSettings) -> _Failed | None:
        """SGLang: both hops at once, tied by a bootstrap room."""
        prefill = pair.prefill
        assert prefill is not None
        p_body, d_body, _room = bodies.bootstrap(prefill)
        ptask = asyncio.ensure_future(prefill_hop(x, self.pool, self.metrics, self.pd_metrics, pairer, info, prefill,
                                                  head, headers, p_body, pd.prefill_timeout_s, None))
        dtask = asyncio.ensure_future(self._decode(x, feedback, info, pair.decode, head, headers, d_body,
                                                   SGLANG_BOOTSTRAP))
        try:
            done, _ = await asyncio.wait((ptask, dtask), return_when=asyncio.FIRST_COMPLETED)
            if ptask in done:
                pout: PrefillOutcome = ptask.result()  # RequestError (pool) propagates
                if (pout.failure is not None or pout.status >= 400) and not x.committed:
                    dtask.cancel()  # its KV will never come
                    with contextlib.suppress(asyncio.CancelledError):
                        await dtask
                    if x.committed:  # answered while being cancelled: it stands
                        return None
                    if pout.failure is not None:
                        return _Failed("prefill", prefill, pout.failure)
                    await _answer(x, pout)
                    return None
                return await dtask
            dres = dtask.result()
            if dres is not None or x.status != 200:  # decode failed or refused: nobody will claim the KV
                ptask.cancel()
            else:  # its reply follows the KV push the decode has used: wait for it (health record)
                with contextlib.suppress(Exception):
                    await ptask
            return dres
        finally:
            # the decode first: its engine then records the client's abort, not a KV transfer
            # that failed because the prefill went first
            for task in (dtask, ptask):
                if not task.done():
                    task.cancel()
            # bounded: a running prefill ends at its own deadline; cancelled tasks end now
            await asyncio.gather(ptask, dtask, return_exceptions=True)

    async def _decode(self, x: Exchange, feedback: _DecodeSide, info: Any, ep: EndpointState, head: bytes,
                      headers: bytes, payload: bytes, connector: str) -> _Failed | None:
        """The decode hop (connector "" for a decode-only pair)."""
        x.endpoint_label = ep.key
        tail = headers + b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n"
        t0 = time.perf_counter()
        pending = ep.health.begin()
        try:
            fail = await self.executor.attempt(x, ep, head, tail, payload, info, pending, feedback,
                                               self.decode_relay)
        except BaseException:
            ep.health.abandon(pending)
            raise
        ep.health.finish(pending, None if fail is None else fail.failure)
        pdm = self.pd_metrics
        status = "200" if fail is None and x.status == 200 else \
            (str(x.status) if x.committed else ("504" if fail is not None and fail.failure is Failure.TIMEOUT
                                                else "502"))
        pdm.decode_hop(x.model_label, x.path_label, status, time.perf_counter() - t0)
        if connector and x.stream and x.att_ttft is not None:
            pdm.observe_kv_wait(x.server_label, x.model_label, connector, x.att_ttft)
        if fail is None:
            return None
        self.metrics.upstream_error(x.server_label, ep.key, fail.failure.value)
        pdm.hop_failure(x.server_label, "decode", fail.failure.value)
        return _Failed("decode", ep, fail)


def _order(pairs: list[PdPair], preferred: EndpointState | None) -> list[PdPair]:
    """The pairer's order, with pairs whose ends are usable (not ejected) first, and the
    session's preferred decode endpoint (stickiness) first among those."""
    now = time.monotonic()

    def rank(p: PdPair) -> int:
        ok = p.decode.health.usable(now) and (p.prefill is None or p.prefill.health.usable(now))
        return (0 if ok else 2) + (0 if preferred is not None and p.decode is preferred else 1)

    return sorted(pairs, key=rank)


async def _answer(x: Exchange, out: PrefillOutcome) -> None:
    """The prefill engine refused the request (4xx): the client gets that answer."""
    resp = out.resp
    assert resp is not None
    x.commit(out.status)
    x.error_type = "upstream_4xx"
    x.last_send()
    await x.down.respond(out.status, x.start_headers(resp), out.reply)
