"""Rate limits: the rateLimits section and key limits parsers, Kthena's rateLimit accepted,
bucket arithmetic, admission/settlement against local buckets, the reset header format."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from config_fixtures import endpoints, load, route, server

from kthena_router.config import ConfigError
from kthena_router.errors import RequestError
from kthena_router.identity.model import ANONYMOUS, Identity
from kthena_router.ratelimit.bucket import LeasedBucket, LocalBucket, Refusal
from kthena_router.ratelimit.config import KeyLimits, Limit, parse_key_limits, parse_rate_limits
from kthena_router.ratelimit.limiter import Limiter, reset_text
from kthena_router.ratelimit.metrics import RateLimitMetrics
from kthena_router.scheduling.config import load_router_configuration_bytes
from prometheus_client import CollectorRegistry


class _Errs:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def err(self, path: str, message: str) -> None:
        self.problems.append((path, message))


def test_kthena_rate_limit_is_accepted(tmp_path: Path) -> None:
    r = route()
    r["spec"]["rateLimit"] = {"inputTokensPerUnit": 10, "outputTokensPerUnit": 5, "unit": "minute",
                              "global": {"redis": {"address": "redis.kthena-system:6379"}}}
    cfg = load(tmp_path, [r, server(), endpoints()])
    rl = cfg.routes[0].rate_limit
    assert (rl.unit, rl.input_tokens_per_unit, rl.output_tokens_per_unit, rl.global_redis_address) == \
        ("minute", 10, 5, "redis.kthena-system:6379")


@pytest.mark.parametrize("value,field,fragment", [
    ({"unit": "week"}, "spec.rateLimit.unit", "must be one of second, minute, hour, day, month"),
    ({"inputTokensPerUnit": 0}, "spec.rateLimit.inputTokensPerUnit", "between 1 and"),
    ({"global": {"redis": {}}}, "spec.rateLimit.global.redis.address", "required"),
    ({"global": {"redis": {"address": "nohost"}}}, "spec.rateLimit.global.redis.address", "host:port"),
    ({"global": {"redis": {"address": "r:6379", "password": "x"}}}, "spec.rateLimit.global.redis.password",
     "unknown field"),
])
def test_kthena_rate_limit_shape_errors(tmp_path: Path, value: dict, field: str, fragment: str) -> None:
    r = route()
    r["spec"]["rateLimit"] = value
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, [r, server(), endpoints()])
    assert [(p.field, fragment in p.message) for p in ei.value.problems] == [(field, True)], str(ei.value)


def test_section_defaults_and_route_overrides() -> None:
    rc = load_router_configuration_bytes(b"""
rateLimits:
  failMode: closed
  maxPromptTokens: 1000
  perTenant: {inputTokensPerUnit: 100, unit: minute}
  perUser: {requestsPerUnit: 5}
  tenants: {acme: {outputTokensPerUnit: 7, unit: day}}
  routes:
    llama: {failMode: open, perUser: {}}
    other/x: {perTenantModel: {requestsPerUnit: 2, unit: hour}}
""")
    s = rc.rate_limits
    assert s.defaults.fail_mode == "closed" and s.defaults.max_prompt_tokens == 1000
    assert s.defaults.per_tenant == Limit("minute", 100, None, None)
    assert s.defaults.tenants["acme"] == Limit("day", None, 7, None)
    llama = s.for_route("default", "llama")
    assert llama.fail_mode == "open" and llama.per_user is None and llama.per_tenant is s.defaults.per_tenant
    x = s.for_route("other", "x")
    assert x.per_tenant_model == Limit("hour", None, None, 2) and x.fail_mode == "closed"
    assert s.for_route("default", "unlisted") is s.defaults


def test_section_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as ei:
        load_router_configuration_bytes(b"""
rateLimits:
  failMode: maybe
  perTenant: {}
  perUser: {inputTokensPerUnit: -1}
  leasePercent: 150
  redis: {address: nope}
  routes: {r: {bogus: 1}}
""", source="rc.yaml")
    fields = sorted(p.field for p in ei.value.problems)
    assert fields == ["rateLimits.failMode", "rateLimits.leasePercent", "rateLimits.perTenant",
                      "rateLimits.perUser.inputTokensPerUnit", "rateLimits.redis.address",
                      "rateLimits.routes.r.bogus"], str(ei.value)
    assert all(p.file == "rc.yaml" for p in ei.value.problems)


def test_key_limits_shape() -> None:
    c = _Errs()
    assert parse_key_limits(c, {"requestsPerUnit": 3, "unit": "hour", "maxPromptTokens": 50}, "keys[0].limits") == \
        KeyLimits(Limit("hour", None, None, 3), 50)
    assert parse_key_limits(c, {"maxPromptTokens": 50}, "p") == KeyLimits(None, 50)
    assert parse_key_limits(c, None, "p") is None and not c.problems
    parse_key_limits(c, {"tokensPerMinute": 1}, "keys[1].limits")
    assert [p for p, _ in c.problems] == ["keys[1].limits.tokensPerMinute", "keys[1].limits"]


def test_absent_section_is_empty() -> None:
    assert parse_rate_limits(_Errs(), None).defaults.empty


def test_local_bucket_refills_goes_into_debt_and_reports() -> None:
    b = LocalBucket(100, 10, now=0.0)  # 100 per 10 s
    assert b.acquire(60, 60, 0.0) == 60
    r = b.acquire(60, 60, 0.0)
    assert isinstance(r, Refusal) and r.remaining == 40 and r.retry_after_s == pytest.approx(2.0)
    assert r.reset_s == pytest.approx(6.0)
    assert b.acquire(60, 60, 2.0) == 60  # refilled 20
    b.charge(30)  # unconditional: settlement above the estimate
    assert b.tokens == -30
    assert isinstance(b.acquire(1, 50, 2.0), Refusal)  # output needs one token there
    assert b.acquire(1, 50, 5.2) == 50 and b.tokens == pytest.approx(-48)  # all 50: 48 of debt at once
    assert isinstance(b.acquire(1, 50, 5.2), Refusal)  # so the next one waits for the refill to pay it
    assert b.acquire(0, 0, 10.0) == 0  # paid off by 10.0 s (48 at 10 per s)
    b.charge(-1000)
    assert b.tokens == 100  # a refund never exceeds the capacity
    assert b.acquire(1, 40, 10.0) == 40 and b.tokens == 60  # a full reservation when it is there


def test_leased_bucket_spends_locally_then_owes() -> None:
    b = LeasedBucket("k", 1000, 1, lease_percent=2)
    assert b.chunk == 20 and b.acquire_local(5, 5) is None
    b.lease = 25
    assert b.acquire_local(5, 5) == 5 and b.lease == 20
    assert b.acquire_local(1, 0) == 0 and b.lease == 20  # a check takes nothing
    assert b.acquire_local(1, 50) is None and b.lease == 20  # less than the reservation: Redis decides
    assert b.acquire_local(1, 20) == 20 and b.lease == 0
    b.lease = 20
    assert not b.charge(10) and b.charge(15) and b.lease == -5  # a debt to pay to Redis


@pytest.mark.parametrize("s,text", [(0, "0s"), (0.0201, "21ms"), (1.5, "1.5s"), (360, "6m0s"),
                                    (3725.25, "1h2m5.25s")])
def test_reset_text(s: float, text: str) -> None:
    assert reset_text(s) == text


def _limiter(section_yaml: bytes) -> Limiter:
    rc = load_router_configuration_bytes(section_yaml)
    return Limiter(RateLimitMetrics(CollectorRegistry()), lambda: rc.rate_limits)


def _route(tmp_path: Path, rate_limit: dict | None = None):
    r = route()
    if rate_limit:
        r["spec"]["rateLimit"] = rate_limit
    return load(tmp_path, [r, server(), endpoints()]).routes[0]


def _x(status: int = 200, prompt: int | None = None, completion: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(att_prompt_tokens=prompt, completion_tokens=completion, status=status,
                           model_label="m", path_label="/v1/chat/completions")


def _body(n: int, model: str = "m") -> SimpleNamespace:
    return SimpleNamespace(raw=b"x" * n, obj={"messages": []}, model=model)


def test_no_limit_no_plan_and_key_limits_make_one(tmp_path: Path) -> None:
    lim = _limiter(b"{}")
    r = _route(tmp_path)
    assert lim.plan(r, ANONYMOUS) is None
    ident = Identity("acme", "a", "", "api_key", "k1", limits=KeyLimits(Limit("hour", None, None, 1)))
    plan = lim.plan(r, ident)
    assert plan is not None

    async def go() -> None:
        await plan.admit(_x(), _body(10), ident)
        with pytest.raises(RequestError) as ei:
            await plan.admit(_x(), _body(10), ident)
        assert ei.value.status == 429 and (b"x-ratelimit-limit-requests", b"1") in ei.value.headers

    asyncio.run(go())


def test_settlement_charges_real_usage_and_refunds_unserved(tmp_path: Path) -> None:
    lim = _limiter(b"{}")
    r = _route(tmp_path, {"inputTokensPerUnit": 1000, "outputTokensPerUnit": 1000, "unit": "hour"})
    plan = lim.plan(r, ANONYMOUS)
    inp, out = plan.fixed[0].bucket, plan.fixed[1].bucket

    async def go() -> None:
        t = await plan.admit(_x(), _body(400), ANONYMOUS)  # estimate 400/4 = 100
        assert inp.tokens == pytest.approx(900, abs=1)
        t.streamed(b"data: {}\n\ndata: {}\n\n")  # two events, charged at once
        assert out.tokens == pytest.approx(998, abs=1)
        t.settle(_x(prompt=130, completion=7))
        assert inp.tokens == pytest.approx(870, abs=1) and out.tokens == pytest.approx(993, abs=1)
        t = await plan.admit(_x(), _body(400), ANONYMOUS)
        t.settle(_x(status=503))  # never reached an engine: the reservation goes back
        assert inp.tokens == pytest.approx(870, abs=1)

    asyncio.run(go())
    assert plan.estimator.ratio == pytest.approx((4 * 64 * 0.99 + 400) / (64 * 0.99 + 130))  # decayed prior


def test_output_reserves_max_tokens_so_concurrent_requests_cannot_share_the_last_tokens(tmp_path: Path) -> None:
    lim = _limiter(b"{}")
    plan = lim.plan(_route(tmp_path, {"outputTokensPerUnit": 100, "unit": "hour"}), ANONYMOUS)
    out = plan.fixed[0].bucket

    def body(**kw: int) -> SimpleNamespace:
        return SimpleNamespace(raw=b"x" * 40, obj={"messages": [], **kw}, model="m")

    async def go() -> None:
        a = await plan.admit(_x(), body(max_tokens=40), ANONYMOUS)
        b = await plan.admit(_x(), body(max_completion_tokens=20, n=2), ANONYMOUS)
        assert out.tokens == pytest.approx(20, abs=0.1)
        c = await plan.admit(_x(), body(max_tokens=40), ANONYMOUS)  # 20 there: admitted, reserves 40
        assert out.tokens == pytest.approx(-20, abs=0.1)  # the 20 missing are owed at once
        with pytest.raises(RequestError) as ei:
            await plan.admit(_x(), body(max_tokens=1), ANONYMOUS)  # not even one token there
        assert ei.value.status == 429
        a.streamed(b"data: {}\n\n" * 30)  # within its reservation: nothing charged yet
        c.streamed(b"data: {}\n\n" * 25)
        assert out.tokens == pytest.approx(-20, abs=0.1)
        c.streamed(b"data: {}\n\n" * 20)  # 45 streamed: 5 beyond its reservation
        assert out.tokens == pytest.approx(-25, abs=0.1)
        a.settle(_x(completion=31))  # 9 of its 40 come back
        b.settle(_x(status=503))  # never served: all 40 come back
        c.settle(_x(completion=45))
        assert out.tokens == pytest.approx(100 - 31 - 45, abs=0.1)

    asyncio.run(go())


def test_refusal_by_one_bucket_gives_back_the_others(tmp_path: Path) -> None:
    lim = _limiter(b"rateLimits: {perTenant: {requestsPerUnit: 100, unit: hour}, "
                   b"perUser: {inputTokensPerUnit: 50, unit: hour}}\n")
    plan = lim.plan(_route(tmp_path), ANONYMOUS)
    ident = Identity("acme", "bob", "", "api_key", "k")

    async def go() -> None:
        with pytest.raises(RequestError) as ei:
            await plan.admit(_x(), _body(400), ident)  # ~100 tokens > 50 for this user
        assert "more than the limit of 50" in ei.value.message
        tenant_requests = lim.slots("kthena:rl:tenant:*:acme", Limit("hour", None, None, 100), None, "")[0]
        assert tenant_requests.bucket.tokens == pytest.approx(100)

    asyncio.run(go())


def test_per_user_and_per_tenant_model_buckets_and_a_route_override(tmp_path: Path) -> None:
    """perUser: one bucket per (tenant, user); perTenantModel: one per (tenant, requested
    model); a route override ({} = off) changes only its own route."""
    rc = load_router_configuration_bytes(b"rateLimits: {perUser: {requestsPerUnit: 2, unit: hour}, "
                                         b"perTenantModel: {requestsPerUnit: 3, unit: hour}, "
                                         b"routes: {free: {perUser: {}, perTenantModel: {}}}}\n")
    lim = Limiter(RateLimitMetrics(CollectorRegistry()), lambda: rc.rate_limits)
    cfg = load(tmp_path, [route("r", "m"), route("free", "f"), server(), endpoints()])
    r, free = (next(x for x in cfg.routes if x.name == n) for n in ("r", "free"))
    alice, bob = Identity("acme", "alice", "", "api_key", "a"), Identity("acme", "bob", "", "api_key", "b")
    other_alice = Identity("beta", "alice", "", "api_key", "c")

    async def go() -> None:
        async def admit(route_: object, ident: Identity, model: str) -> str:
            plan = lim.plan(route_, ident)  # type: ignore[arg-type]
            try:
                await plan.admit(_x(), _body(40, model), ident)
            except RequestError as e:
                assert e.status == 429
                return e.message
            return "ok"

        assert [await admit(r, alice, "m") for _ in range(2)] == ["ok", "ok"]
        assert "user acme/alice" in (await admit(r, alice, "m"))  # her own bucket: 2 an hour
        assert await admit(r, bob, "m") == "ok"  # another user of acme: (acme, m) now has 3
        assert "tenant acme on model m" in (await admit(r, bob, "m"))
        assert await admit(r, bob, "m2") == "ok"  # another requested model: another bucket
        assert await admit(r, other_alice, "m") == "ok"  # same user name, other tenant
        assert lim.plan(free, alice) is None  # the override switched both off: nothing left on this route
        assert "user acme/alice" in (await admit(r, alice, "m"))

    asyncio.run(go())


def test_overhead_benchmark_governance_configuration_loads() -> None:
    """configs/bench/governance.yaml (docs/overhead.md, step 5's cost figures): auth, limits on
    every scope the figure claims, and fair queuing, with the key the benchmark sends."""
    from kthena_router.scheduling.config import load_router_configuration_file

    rc = load_router_configuration_file(Path(__file__).resolve().parents[2] / "configs" / "bench" / "governance.yaml")
    assert rc.auth is not None and rc.auth.keys is not None
    found = rc.auth.keys.lookup("sk-bench-0000000000000000")
    assert found is not None and found.identity.tenant == "bench"
    d = rc.rate_limits.defaults
    assert d.route is not None and d.per_tenant is not None and d.per_user is not None
    assert rc.fairness is not None and rc.fairness.enabled
