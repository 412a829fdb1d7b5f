"""Admission and settlement of token rate limits for one request.

Per request (forward.py): `Limiter.plan(route, identity)` -> a `Plan` or None (no limit
applies: the only cost); `await plan.admit(x, body, identity)` -> a `Ticket` or
RequestError (429, 400 for the prompt cap, 503 for a fail-closed Redis outage); the SSE
relay calls `ticket.streamed(bytes)` for output as it goes out; `ticket.settle(x)` in
forward.py's `finally` charges the difference to the engine's real usage.

Buckets a request passes (each dimension it has: input tokens, output tokens, requests):
Kthena's `ModelRoute.spec.rateLimit` (global when it names a Redis), and from the
`rateLimits` section the route's total, its tenant's, its user's, its (tenant, model)'s,
and the API key's own limits. Input needs the estimate to be there and takes it; output
needs one token to be there (Kthena's rule), reserves the request's max_tokens (what is
missing is a debt at once), and is charged beyond that reservation as it streams; requests
take 1.
A refusal by any bucket gives back what the others took.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from kthena_router.config.model import ModelRoute
from kthena_router.errors import RequestError

from .bucket import LeasedBucket, LocalBucket, Refusal
from .config import DEFAULT_RATE_LIMITS, UNIT_SECONDS, KeyLimits, Limit, LimitSet, RateLimitSettings
from .estimate import TokenEstimator
from .metrics import RateLimitMetrics
from .redis_store import RedisStore, StoreDown

__all__ = ["Limiter", "Plan", "Ticket", "requested_output", "reset_text"]

INPUT, OUTPUT, REQUESTS = 0, 1, 2
_DIM_NAMES = ("input_tokens", "output_tokens", "requests")
_DIM_TEXT = ("input tokens", "output tokens", "requests")
_KTHENA_DIM = ("input", "output", "requests")
_MAX_LOCAL_BUCKETS = 100_000  # then full (idle) buckets are dropped: a new one is the same


class _Slot:
    """One bucket of one dimension as a request sees it."""

    __slots__ = ("dim", "bucket", "store", "desc", "kind", "limit", "unit", "scale")

    def __init__(self, dim: int, bucket: LocalBucket | LeasedBucket, store: RedisStore | None, desc: str,
                 kind: str, limit: int, unit: str, scale: float) -> None:
        self.dim = dim
        self.kind = kind  # model | route | tenant | user | tm | key (the metric's reason)
        self.bucket = bucket
        self.store = store
        self.desc = desc  # "route default/llama", "tenant acme", ...
        self.limit = limit  # as configured (headers)
        self.unit = unit
        self.scale = scale  # configured / this worker's share (local buckets with several workers)

    def charge(self, n: float) -> None:
        if self.store is None:
            self.bucket.charge(n)  # type: ignore[union-attr]
        else:
            self.store.charge(self.bucket, n)  # type: ignore[arg-type]


class Limiter:
    """Per worker: plans per route, buckets (local and leased), Redis stores."""

    def __init__(self, metrics: RateLimitMetrics, section: Callable[[], RateLimitSettings | None],
                 workers: int = 1) -> None:
        self.metrics = metrics
        self.section = section  # the installed router configuration's rateLimits (None: defaults)
        self.workers = workers
        self._section: RateLimitSettings | None = None
        self._plans: dict[int, tuple[ModelRoute, Plan]] = {}
        self._slots: dict[tuple[Any, ...], tuple[_Slot, ...]] = {}
        self._local: dict[str, LocalBucket] = {}
        self._stores: dict[str, RedisStore] = {}
        self._estimators: dict[str, TokenEstimator] = {}

    # --- resolution (cached per installed route object and section) ----------------------

    def plan(self, route: ModelRoute, identity: Any) -> Plan | None:
        sec = self.section() or DEFAULT_RATE_LIMITS
        if sec is not self._section:
            self._section = sec
            self._plans.clear()
            self._slots.clear()
        entry = self._plans.get(id(route))
        if entry is None or entry[0] is not route:
            if len(self._plans) > 4096:  # routes of many replaced states
                self._plans.clear()
            entry = self._plans[id(route)] = (route, self._build(route, sec))
        p = entry[1]
        return p if p.active or identity.limits is not None else None

    def _build(self, route: ModelRoute, sec: RateLimitSettings) -> Plan:
        lset = sec.for_route(route.namespace, route.name)
        rl = route.rate_limit
        label = f"{route.namespace}/{route.name}"
        fixed: list[_Slot] = []
        if rl is not None:
            model = route.model_name or route.name
            limit = Limit(rl.unit, rl.input_tokens_per_unit, rl.output_tokens_per_unit)
            store = self._store(rl.global_redis_address, sec)
            # Kthena's key layout, so that a Kthena router and this one share the bucket
            fixed += self.slots(f"kthena:ratelimit:{model}", limit, store, f"model {model}", kthena=True)
        store = self._store(sec.redis_address, sec)
        if lset.route is not None:
            fixed += self.slots(f"kthena:rl:route:{label}", lset.route, store, f"route {label}")
        origin = {name: "*" if getattr(lset, name) is getattr(sec.defaults, name) else label
                  for name in ("per_tenant", "per_user", "per_tenant_model", "tenants")}
        plan = Plan(self, label, route.model_name or "", lset, tuple(fixed), store, origin)
        plan.active = rl is not None or not lset.empty  # else only API keys' own limits apply
        return plan

    def key_store(self) -> RedisStore | None:
        """Where API keys' own buckets live: the section's Redis, if any."""
        sec = self._section or DEFAULT_RATE_LIMITS
        return self._store(sec.redis_address, sec)

    def _store(self, address: str | None, sec: RateLimitSettings) -> RedisStore | None:
        if address is None:
            return None
        store = self._stores.get(address)
        if store is None:
            store = self._stores[address] = RedisStore(address, sec.redis_timeout_s, sec.redis_retry_s,
                                                       sec.lease_idle_s, self.metrics.redis_error)
        return store

    def slots(self, scope: str, limit: Limit, store: RedisStore | None, desc: str,
              kthena: bool = False) -> tuple[_Slot, ...]:
        """The slots of one scope's limit (cached until the section changes)."""
        ck = (scope, limit, store)
        out = self._slots.get(ck)
        if out is not None:
            return out
        unit_s = UNIT_SECONDS[limit.unit]
        kind = "model" if kthena else scope.split(":")[2]
        made: list[_Slot] = []
        for dim, cap in ((REQUESTS, limit.requests), (INPUT, limit.input_tokens), (OUTPUT, limit.output_tokens)):
            if cap is None:
                continue
            key = f"{scope}:{_KTHENA_DIM[dim]}" if kthena else f"{scope}:{_DIM_NAMES[dim]}"
            if store is not None:
                sec = self._section or DEFAULT_RATE_LIMITS
                bucket: LocalBucket | LeasedBucket = store.bucket(key, cap, cap / unit_s, sec.lease_percent)
                scale = 1.0
            else:
                # Several workers: each holds its share (see docs/ratelimit.md; Redis is exact).
                scale = float(self.workers)
                bucket = self._local_bucket(key, cap / scale, cap / unit_s / scale)
            made.append(_Slot(dim, bucket, store, desc, kind, cap, limit.unit, scale))
        out = self._slots[ck] = tuple(made)
        return out

    def _local_bucket(self, key: str, capacity: float, rate: float) -> LocalBucket:
        b = self._local.get(key)
        if b is None:
            if len(self._local) >= _MAX_LOCAL_BUCKETS:
                now = time.monotonic()
                for k in [k for k, v in self._local.items() if v.full(now)]:
                    del self._local[k]
                self._slots.clear()
            b = self._local[key] = LocalBucket(capacity, rate, time.monotonic())
        else:
            b.reshape(capacity, rate)
        return b

    def estimator(self, label: str) -> TokenEstimator:
        e = self._estimators.get(label)
        if e is None:
            e = self._estimators[label] = TokenEstimator()
        return e

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()


class Plan:
    """One route's limits."""

    __slots__ = ("limiter", "label", "model", "lset", "fixed", "store", "origin", "estimator", "dynamic", "active",
                 "admitted", "charged_in", "charged_out")

    def __init__(self, limiter: Limiter, label: str, model: str, lset: LimitSet, fixed: tuple[_Slot, ...],
                 store: RedisStore | None, origin: dict[str, str] | None = None) -> None:
        self.limiter = limiter
        self.label = label
        self.model = model
        self.lset = lset
        self.fixed = fixed
        self.store = store  # the section's Redis (tenant, user and key buckets), None = local
        self.origin = origin or {}
        self.estimator = limiter.estimator(label)
        m = limiter.metrics  # the per-request metric children, resolved once
        self.admitted = m.child(m.decisions, label, "admitted", "")
        self.charged_in = m.child(m.charged, label, "input")
        self.charged_out = m.child(m.charged, label, "output")
        self.active = True
        self.dynamic = lset.per_tenant is not None or lset.per_user is not None \
            or lset.per_tenant_model is not None or bool(lset.tenants)

    def _slots_for(self, identity: Any, model: str) -> list[_Slot]:
        lim = self.limiter
        lset = self.lset
        out = list(self.fixed)
        tenant, user = identity.tenant, identity.user
        if self.dynamic:
            t_limit = lset.tenants.get(tenant, lset.per_tenant)
            if t_limit is not None:
                o = self.origin["tenants" if tenant in lset.tenants else "per_tenant"]
                out += lim.slots(f"kthena:rl:tenant:{o}:{tenant}", t_limit, self.store, f"tenant {tenant or '-'}")
            if lset.per_user is not None:
                out += lim.slots(f"kthena:rl:user:{self.origin['per_user']}:{tenant}/{user}", lset.per_user,
                                 self.store, f"user {tenant or '-'}/{user or '-'}")
            if lset.per_tenant_model is not None:
                out += lim.slots(f"kthena:rl:tm:{self.origin['per_tenant_model']}:{tenant}/{model}",
                                 lset.per_tenant_model, self.store, f"tenant {tenant or '-'} on model {model}")
        keylim: KeyLimits | None = identity.limits
        if keylim is not None and keylim.limit is not None:
            out += lim.slots(f"kthena:rl:key:{identity.key_name}", keylim.limit, lim.key_store(),
                             f"API key {identity.key_name}")
        return out

    async def admit(self, x: Any, body: Any, identity: Any) -> Ticket:
        """Take what the request needs from every bucket, or refuse (nothing taken then)."""
        metrics = self.limiter.metrics
        raw = len(body.raw)
        est = self.estimator.estimate(raw)
        cap = self.lset.max_prompt_tokens
        keylim = identity.limits
        if keylim is not None and keylim.max_prompt_tokens is not None:
            cap = keylim.max_prompt_tokens if cap is None else min(cap, keylim.max_prompt_tokens)
        if cap is not None and est > cap:
            metrics.decision(self.label, "too_long", "max_prompt_tokens")
            raise RequestError(400, f"the prompt is about {est} tokens, over this route's limit of {cap} "
                                    "(maxPromptTokens; estimated from the request size)",
                               param="messages" if "messages" in body.obj else "prompt", code="prompt_too_long")
        slots = self._slots_for(identity, body.model) if (self.dynamic or keylim is not None) else self.fixed
        ticket = Ticket(self, est, raw)
        reserve = requested_output(body.obj)
        now = time.monotonic()
        failed_open = False
        for slot in slots:
            dim = slot.dim
            need = est if dim == INPUT else 1
            want = reserve if dim == OUTPUT else need
            store = slot.store
            r: Refusal | float | None
            if store is None:
                r = slot.bucket.acquire(need, want, now)  # type: ignore[union-attr]
            else:
                r = slot.bucket.acquire_local(need, want)  # type: ignore[union-attr]
            if store is not None and r is None:
                try:
                    r = await store.take(slot.bucket, need, want)  # type: ignore[arg-type]
                except asyncio.CancelledError:  # the client left while Redis answered
                    ticket.rollback()
                    raise
                except StoreDown:
                    if self.lset.fail_mode == "closed":
                        ticket.rollback()
                        metrics.decision(self.label, "failed_closed", "redis_unavailable")
                        raise RequestError(503, "the rate-limit store is unreachable and this route fails "
                                                "closed; retry later", code="ratelimit_unavailable",
                                           headers=[(b"retry-after", b"1")]) from None
                    failed_open = True  # admitted without this bucket, and not charged to it
                    continue
            if isinstance(r, Refusal):
                ticket.rollback()
                metrics.decision(self.label, "limited", f"{_DIM_NAMES[dim]}/{slot.kind}")
                metrics.exceeded_for(x.model_label, _DIM_NAMES[dim], x.path_label)
                raise _refusal(slot, r, need)
            ticket.add(slot, r)  # type: ignore[arg-type]
        if failed_open:
            metrics.decision(self.label, "failed_open")
        else:
            self.admitted.inc()
        return ticket


class Ticket:
    """What one admitted request took; charged to the real usage at the end."""

    __slots__ = ("plan", "est", "raw", "inputs", "outputs", "taken", "streamed_events")

    def __init__(self, plan: Plan, est: int, raw: int) -> None:
        self.plan = plan
        self.est = est
        self.raw = raw
        self.inputs: list[_Slot] = []
        self.outputs: list[list[Any]] = []  # [slot, output tokens it holds: reservation, then streamed]
        self.taken: list[tuple[_Slot, float]] = []
        self.streamed_events = 0

    def add(self, slot: _Slot, took: float) -> None:
        self.taken.append((slot, took))
        if slot.dim == INPUT:
            self.inputs.append(slot)
        elif slot.dim == OUTPUT:
            self.outputs.append([slot, took])

    def rollback(self) -> None:
        for slot, took in self.taken:
            if took:
                slot.charge(-took)
        self.taken.clear()

    def streamed(self, out: bytes) -> None:
        """SSE bytes that went to the client: one token per event, charged now (the final
        usage corrects it at settlement)."""
        n = out.count(b"\n\n")
        if n:
            streamed = self.streamed_events = self.streamed_events + n
            for held in self.outputs:
                if streamed > held[1]:  # beyond the reservation
                    held[0].charge(streamed - held[1])
                    held[1] = streamed

    def settle(self, x: Any) -> None:
        plan = self.plan
        prompt = x.att_prompt_tokens
        if prompt is not None:
            plan.estimator.observe(self.raw, prompt)
            charged_in, delta = prompt, prompt - self.est
        elif x.status == 200 or self.streamed_events:
            charged_in, delta = self.est, 0  # the engine read it, the reply did not say how much
        else:
            charged_in, delta = 0, -self.est  # never reached an engine (or it refused the request)
        if delta:
            for slot in self.inputs:
                slot.charge(delta)
        completion = x.completion_tokens
        charged_out = completion if completion is not None else self.streamed_events
        for slot, held in self.outputs:  # the unused reservation goes back
            if charged_out != held:
                slot.charge(charged_out - held)
        if charged_in:
            plan.charged_in.inc(charged_in)
        if charged_out:
            plan.charged_out.inc(charged_out)


def requested_output(obj: Any) -> int:
    """The most output tokens the request asks for (max_tokens x n), 1 when it does not say."""
    if not isinstance(obj, dict):
        return 1
    m = obj.get("max_completion_tokens") or obj.get("max_tokens") or obj.get("max_output_tokens")
    n = obj.get("n")
    if type(m) is not int or m < 1:
        return 1
    return m * n if type(n) is int and n > 1 else m


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes x-ratelimit-reset-*: "20ms", "1.5s", "6m0s", "1h2m5s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    text = f"{s:.3f}".rstrip("0").rstrip(".") + "s"
    if h or m:
        text = f"{int(m)}m" + text
    if h:
        text = f"{int(h)}h" + text
    return text


def _refusal(slot: _Slot, r: Refusal, need: float) -> RequestError:
    kind = b"requests" if slot.dim == REQUESTS else b"tokens"
    retry = r.retry_after_s
    remaining = max(0, math.floor(r.remaining * slot.scale))
    headers = [
        (b"retry-after", str(max(1, math.ceil(retry))).encode()),
        (b"retry-after-ms", str(max(1, math.ceil(retry * 1000))).encode()),
        (b"x-ratelimit-limit-" + kind, str(slot.limit).encode()),
        (b"x-ratelimit-remaining-" + kind, str(remaining).encode()),
        (b"x-ratelimit-reset-" + kind, reset_text(r.reset_s).encode()),
    ]
    what = _DIM_TEXT[slot.dim]
    if slot.dim == INPUT and need * slot.scale > slot.limit:
        msg = (f"this request needs about {int(need)} input tokens, more than the limit of {slot.limit} "
               f"per {slot.unit} for {slot.desc}")
    else:
        msg = (f"rate limit exceeded: {what} for {slot.desc} (limit {slot.limit} per {slot.unit}, "
               f"remaining {remaining}); retry after {max(1, math.ceil(retry))}s")
    return RequestError(429, msg, code="rate_limit_exceeded", headers=headers)
