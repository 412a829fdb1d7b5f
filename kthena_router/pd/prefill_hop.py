"""The prefill hop: one non-streamed request to the prefill endpoint, read whole, checked.

Nothing of it reaches the client except a 4xx (the request itself is refused: the decode
engine would refuse it too, so it is answered as is, not retried). Its usage is never
counted: token metrics and rate limits see the decode hop only. Health feedback and the
pairer's prefill side are recorded here; the timeout is the pd section's prefillTimeout
for the whole hop (connect, send, the complete reply), within the request's total.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from kthena_router.endpoints.health import Failure
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.relay import AttemptFailure, Exchange, earliest
from kthena_router.proxy.upstream import BodyTooLarge, PoolExhausted, Response, UpstreamConnectError, \
    UpstreamError, UpstreamPool, UpstreamTimeout

from .connectors import NoKvParams
from .metrics import PdMetrics

__all__ = ["PrefillOutcome", "prefill_hop"]

_MAX_REPLY = 1 << 24  # a one-token reply; anything near this is not one


class PrefillOutcome:
    __slots__ = ("failure", "decode_body", "status", "resp", "reply")

    def __init__(self, failure: AttemptFailure | None, decode_body: bytes | None = None, status: int = 0,
                 resp: Response | None = None, reply: bytes = b"") -> None:
        self.failure = failure  # None: done (decode_body set), or a 4xx to answer (status >= 400)
        self.decode_body = decode_body
        self.status = status
        self.resp = resp
        self.reply = reply


async def prefill_hop(x: Exchange, pool: UpstreamPool, metrics: RouterMetrics, pd_metrics: PdMetrics,
                      pairer: Any, info: Any, ep: EndpointState, head: bytes, headers: bytes, payload: bytes,
                      timeout_s: float, decode_body: Callable[[bytes], bytes] | None) -> PrefillOutcome:
    """Run the hop. `decode_body(reply)` builds the decode hop's body from the reply (raises
    NoKvParams when the reply cannot feed a decode); None: the decode body does not depend on it.
    Raises only CancelledError and RequestError (pool exhausted: the router's, not the engine's)."""
    t = x.timeouts
    loop = asyncio.get_running_loop()
    start = loop.time()
    t0 = time.perf_counter()
    deadline = earliest(start + timeout_s, x.deadline)
    assert deadline is not None
    gauge = metrics.upstream(x.route_label, x.server_label, ep.key)
    gauge.inc()
    pending = ep.health.begin()
    pairer.dispatched(ep, info, "prefill")
    conn = resp = None
    out: PrefillOutcome | None = None
    try:
        try:
            dest = pool.h1.dest(ep.ip, ep.port, ep.ssl, ep.server_hostname, ep.host)
            left = deadline - start
            conn = await pool.h1.acquire(dest, min(t.connect_s, left), min(t.pool_wait_s, left))
            conn.send(head + dest.host_line + headers + b"content-length: " + str(len(payload)).encode()
                      + b"\r\n\r\n", payload)
            conn.timeout_s = None
            conn.deadline = deadline
            resp = await conn.read_head()
            ep.health.first_byte(pending)
            resp.set_timeouts(None, deadline)
            reply = await resp.read_all(_MAX_REPLY)
        except UpstreamTimeout as exc:
            if exc.at_deadline and x.deadline is not None and x.deadline <= start + timeout_s:
                detail = f"the request's total timeout ({t.total_s or 0:g}s) passed"
            else:
                detail = f"no complete prefill reply within prefillTimeout ({timeout_s:g}s)"
            out = PrefillOutcome(AttemptFailure(Failure.TIMEOUT, detail))
        except UpstreamConnectError:
            out = PrefillOutcome(AttemptFailure(Failure.CONNECT, "connection failed"))
        except PoolExhausted as exc:
            raise RequestError(503, f"the router is overloaded: {exc}; retry later", code="pool_exhausted") from None
        except BodyTooLarge:
            out = PrefillOutcome(AttemptFailure(Failure.INVALID, "prefill reply too large"))
        except (UpstreamError, OSError) as exc:
            out = PrefillOutcome(AttemptFailure(Failure.DIED, f"connection lost ({type(exc).__name__})"))
        else:
            out = _check(resp, reply, decode_body)
    except BaseException:
        ep.health.abandon(pending)  # cancelled (client gone, or its decode failed): not its fault
        raise
    finally:
        gauge.dec()
        dt = time.perf_counter() - t0
        pairer.finished(ep, "prefill", dt if out is not None and out.failure is None else None, None, info)
        if resp is not None:
            resp.close()
        elif conn is not None:
            conn.close()
        if out is not None:
            status = str(out.status) if out.status else \
                ("504" if out.failure is not None and out.failure.failure is Failure.TIMEOUT else "502")
            pd_metrics.prefill_hop(x.model_label, x.path_label, status, dt)
    failure = out.failure
    ep.health.finish(pending, None if failure is None else failure.failure)
    if failure is not None:
        reason = "no_kv_params" if out.status == 200 else failure.failure.value
        metrics.upstream_error(x.server_label, ep.key, reason)
        pd_metrics.hop_failure(x.server_label, "prefill", reason)
    return out


def _check(resp: Response, reply: bytes, decode_body: Callable[[bytes], bytes] | None) -> PrefillOutcome:
    status = resp.status
    if status >= 500:
        return PrefillOutcome(AttemptFailure(Failure.HTTP_5XX, f"upstream HTTP {status}"), status=status)
    if status >= 400:
        return PrefillOutcome(None, status=status, resp=resp, reply=reply)
    if status != 200:
        return PrefillOutcome(AttemptFailure(Failure.INVALID, f"unexpected HTTP {status}"), status=status)
    if decode_body is None:
        return PrefillOutcome(None, status=200)
    try:
        return PrefillOutcome(None, decode_body(reply), status=200)
    except NoKvParams as exc:
        return PrefillOutcome(AttemptFailure(Failure.INVALID, str(exc)), status=200)
