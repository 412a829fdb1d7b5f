"""Session stickiness (ModelRoute.spec.sessionSticky) through real routers, engines and Redis.

Engines are told apart by the simulator's per-engine request counters (requests are sent
one at a time). The routers schedule with round-robin scoring, so without affinity one key
visits every engine: the control requests below show it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import auth_harness as ah
import jwt_keys as jk
import openai
import pytest
import redis
import redis_harness

import harness

ROUND_ROBIN = "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: round-robin, weight: 1}\n"
SOURCES = [{"type": "Header", "name": "X-Session-ID"}, {"type": "Query", "name": "session"},
           {"type": "Cookie", "name": "sid"}]
STICKY = "kthena_router_session_sticky_total"


def _config(path: Path, ports: list[int], short_ttl: int = 2) -> Path:
    labels = {"app": "demo"}
    sticky = harness.route_doc("demo", "demo", "demo")
    sticky["spec"]["sessionSticky"] = {"sources": SOURCES}
    short = harness.route_doc("demo-short", "demo-short", "demo")
    short["spec"]["sessionSticky"] = {"sources": SOURCES, "sessionAffinitySeconds": short_ttl}
    plain = harness.route_doc("demo-plain", "demo-plain", "demo")  # no sessionSticky
    return harness.write_config(path, [sticky, short, plain, harness.server_doc("demo", "demo", labels),
                                       harness.endpoints_doc("demo-engines", ports, labels)])


def _router_config(path: Path, sticky: str = "") -> Path:
    path.write_text(ROUND_ROBIN + sticky)
    return path


def _redis_sticky(r: redis_harness.RedisServer, retry_after: str = "1s") -> str:
    return f"sessionSticky:\n  backend: redis\n  redis: {{address: '{r.address}', retryAfter: {retry_after}}}\n"


class Client:
    """One router's OpenAI SDK client; a fresh connection per request reaches every worker."""

    def __init__(self, router: harness.Router) -> None:
        self.router = router
        self.sdk = router.openai(default_headers={"connection": "close"})

    def chat(self, model: str = "demo", *, header: str | None = None, query: str | None = None,
             cookie: str | None = None) -> None:
        headers: dict[str, str] = {}
        if header is not None:
            headers["X-Session-ID"] = header
        if cookie is not None:
            headers["Cookie"] = f"theme=dark; sid={cookie}"
        out = self.sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"hello {time.monotonic()}"}], max_tokens=2,
            extra_headers=headers, extra_query={"session": query} if query is not None else None)
        assert out.choices[0].message.content


def served_by(sim: harness.Simulator, send: Callable[[], None]) -> int:
    before = sim.received()
    send()
    after = sim.received()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) == 1, (before, after)
    return changed[0]


def sticky_count(routers: list[harness.Router], result: str, route: str = "default/demo") -> float:
    return sum(harness.metric_value(harness.parse_metrics(r.metrics_text()), STICKY, result=result,
                                    model_route=route) for r in routers)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    with harness.start_simulator(tmp_path_factory.mktemp("sim"), engines=3, fast=True) as s:
        yield s


@pytest.fixture
def engines(sim: harness.Simulator) -> Iterator[harness.Simulator]:
    sim.reset_faults()
    yield sim
    sim.reset_faults()


@pytest.fixture(scope="module")
def shared(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three routers (1, 1 and 2 workers) sharing one Redis."""
    work = tmp_path_factory.mktemp("shared")
    r = redis_harness.start_redis(work)
    config = _config(work / "routes.yaml", sim.ports)
    rc = _router_config(work / "router.yaml", _redis_sticky(r))
    routers: list[harness.Router] = []
    try:
        for workers in (1, 1, 2):
            routers.append(harness.start_router(config, work, workers=workers,
                                                extra_args=["--router-config", str(rc)]))
        yield {"redis": r, "routers": routers, "clients": [Client(x) for x in routers]}
    finally:
        for x in routers:
            x.stop()
        r.stop()


def test_same_key_reaches_same_engine_through_three_routers(engines: harness.Simulator, shared: dict) -> None:
    clients: list[Client] = shared["clients"]
    hits0, misses0 = sticky_count(shared["routers"], "hit"), sticky_count(shared["routers"], "miss")
    keys = {"h-alice": {"header": "h-alice"}, "q-bob": {"query": "q-bob"}, "c-carol": {"cookie": "c-carol"},
            "h-dave": {"header": "h-dave"}}
    seen: dict[str, set[int]] = {k: set() for k in keys}
    for rnd in range(6):
        for n, (key, how) in enumerate(keys.items()):
            client = clients[(rnd + n) % 3]
            seen[key].add(served_by(engines, lambda: client.chat(**how)))
    assert all(len(s) == 1 for s in seen.values()), seen
    # control: the same header on a route without sessionSticky, and no key at all, visit every engine
    plain = {served_by(engines, lambda: clients[i % 3].chat("demo-plain", header="h-alice")) for i in range(6)}
    no_key = {served_by(engines, lambda: clients[i % 3].chat()) for i in range(6)}
    assert len(plain) > 1 and len(no_key) > 1, (plain, no_key)
    # one miss per key (its first request), hits for the rest, summed over the three routers
    assert sticky_count(shared["routers"], "miss") - misses0 == len(keys)
    assert sticky_count(shared["routers"], "hit") - hits0 == 5 * len(keys)
    assert sticky_count(shared["routers"], "no_key") >= 6
    # the store holds hashes of route + key, never the key itself
    db = redis.Redis(host=harness.HOST, port=shared["redis"].port)
    stored = db.keys("kthena:session:*")
    assert len(stored) >= len(keys) and not any(b"alice" in k for k in stored)


def test_key_moves_off_a_stopped_engine_and_stays_on_its_new_one(engines: harness.Simulator, shared: dict) -> None:
    clients: list[Client] = shared["clients"]
    moves0 = sticky_count(shared["routers"], "moved")
    first = served_by(engines, lambda: clients[0].chat(header="h-erin"))
    assert {served_by(engines, lambda: c.chat(header="h-erin")) for c in clients} == {first}
    engines.set_faults(first, refuse_connections=True)  # the engine is gone
    # the router that tries the pinned engine fails over before the first byte, and re-pins
    moved = served_by(engines, lambda: clients[1].chat(header="h-erin"))
    assert moved != first
    after = {served_by(engines, lambda: clients[i % 3].chat(header="h-erin")) for i in range(9)}
    assert after == {moved}
    engines.set_faults(first, refuse_connections=False)  # back: the key does not return to it
    back = {served_by(engines, lambda: clients[i % 3].chat(header="h-erin")) for i in range(6)}
    assert back == {moved}
    assert sticky_count(shared["routers"], "moved") - moves0 == 1


def test_pin_expires_after_idle_affinity_seconds_and_slides_while_used(engines: harness.Simulator,
                                                                        shared: dict) -> None:
    clients: list[Client] = shared["clients"]
    route = "default/demo-short"  # sessionAffinitySeconds: 2
    misses0 = sticky_count(shared["routers"], "miss", route)
    hits0 = sticky_count(shared["routers"], "hit", route)
    engine = served_by(engines, lambda: clients[0].chat("demo-short", header="h-frank"))
    for i in range(6):  # 3 s of use, one request every 0.5 s: each read refreshes the 2 s expiry
        time.sleep(0.5)
        assert served_by(engines, lambda: clients[i % 3].chat("demo-short", header="h-frank")) == engine
    assert sticky_count(shared["routers"], "hit", route) - hits0 == 6
    time.sleep(3.0)  # idle longer than the affinity
    clients[1].chat("demo-short", header="h-frank")
    assert sticky_count(shared["routers"], "miss", route) - misses0 == 2
    assert sticky_count(shared["routers"], "hit", route) - hits0 == 6


def test_memory_backend_keeps_keys_across_workers(engines: harness.Simulator, tmp_path: Path) -> None:
    """No --router-config: the memory store, one table for the router's workers."""
    router = harness.start_router(_config(tmp_path / "routes.yaml", engines.ports), tmp_path, workers=2)
    try:
        client = Client(router)
        seen = {key: {served_by(engines, lambda: client.chat(header=key)) for _ in range(8)}
                for key in ("m-1", "m-2", "m-3")}
        assert all(len(s) == 1 for s in seen.values()), seen
        control = {served_by(engines, lambda: client.chat("demo-plain", header="m-1")) for _ in range(6)}
        assert len(control) > 1
        pids = {int(p.name.split("-")[1].split(".")[0]) for p in router.runtime_dir.glob("worker-*.json")}
        assert len(pids) == 2
        assert sticky_count([router], "hit") == 3 * 7
        assert list(router.runtime_dir.glob("session-sticky-*.tbl"))
    finally:
        router.stop()


def test_redis_down_requests_succeed_and_affinity_returns_with_it(engines: harness.Simulator,
                                                                   tmp_path: Path) -> None:
    r = redis_harness.start_redis(tmp_path)
    rc = _router_config(tmp_path / "router.yaml", _redis_sticky(r, retry_after="200ms"))
    router = harness.start_router(_config(tmp_path / "routes.yaml", engines.ports), tmp_path,
                                  extra_args=["--router-config", str(rc)])
    try:
        client = Client(router)
        assert len({served_by(engines, lambda: client.chat(header="r-1")) for _ in range(4)}) == 1
        r.kill()
        down = [served_by(engines, lambda: client.chat(header="r-1")) for _ in range(9)]  # every one a 200
        assert len(set(down)) > 1  # scheduled normally (round-robin) while the store is gone
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, STICKY, result="unavailable") == 9
        assert harness.metric_value(fams, "kthena_router_session_sticky_store_errors_total", backend="redis") >= 1
        r.start()  # same port, empty
        time.sleep(0.5)  # past retryAfter
        again = [served_by(engines, lambda: client.chat(header="r-1")) for _ in range(6)]
        assert len(set(again)) == 1, again
    finally:
        router.stop()
        r.stop()


def test_jwt_claim_source_keys_on_the_verified_token(engines: harness.Simulator, tmp_path: Path) -> None:
    """sources: [JWTClaim conv]: tokens of one conversation (signed apart, other users) share
    an engine; without JWT claims (an API-key identity) the source is empty: no key."""
    key = jk.new_key("rsa-sticky")
    (tmp_path / "jwks.json").write_text(json.dumps(jk.jwks(key)))
    ah.write_keys_file(tmp_path / "keys.yaml", {"sk-plain": ah.api_key("plain", tenant="acme")})
    rc = ah.write_router_config(tmp_path / "router.yaml", ah.auth_section(
        tmp_path / "keys.yaml", issuer="https://idp.test", audiences=["kthena-router"],
        jwksFile=str(tmp_path / "jwks.json")))
    rc.write_text(rc.read_text() + ROUND_ROBIN)
    route = harness.route_doc("demo", "demo", "demo")
    route["spec"]["sessionSticky"] = {"sources": [{"type": "JWTClaim", "name": "conv"}]}
    labels = {"app": "demo"}
    config = harness.write_config(tmp_path / "routes.yaml", [route, harness.server_doc("demo", "demo", labels),
                                                             harness.endpoints_doc("e", engines.ports, labels)])
    router = harness.start_router(config, tmp_path, workers=2, extra_args=["--router-config", str(rc)])
    try:
        def chat(token: str) -> None:
            sdk = openai.OpenAI(base_url=router.openai_url, api_key=token, max_retries=0, timeout=60,
                                default_headers={"connection": "close"})
            assert sdk.chat.completions.create(model="demo", max_tokens=2,
                                               messages=[{"role": "user", "content": "hi"}]).choices

        for conv in ("c-1", "c-2"):
            seen = {served_by(engines, lambda i=i: chat(key.sign(jk.claims(f"user-{i}", conv=conv))))
                    for i in range(6)}
            assert len(seen) == 1, (conv, seen)
        no_claim = {served_by(engines, lambda: chat("sk-plain")) for _ in range(6)}
        assert len(no_claim) > 1
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, STICKY, result="hit") == 10
        assert harness.metric_value(fams, STICKY, result="no_key") == 6
    finally:
        router.stop()


def test_router_configuration_route_overrides(engines: harness.Simulator, tmp_path: Path) -> None:
    """sessionSticky.routes (the router configuration's per-route settings, also how Kubernetes
    mode sets it: Kthena's CRD has no sessionSticky): "name" makes the route without its own
    block sticky; "namespace/name" replaces the sources of a route that has one."""
    config = _config(tmp_path / "routes.yaml", engines.ports)
    rc = _router_config(tmp_path / "router.yaml", (
        "sessionSticky:\n  routes:\n"
        "    demo-plain: {sources: [{type: Header, name: X-Session-ID}]}\n"
        "    default/demo: {sources: [{type: Cookie, name: sid}]}\n"))
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)])
    try:
        client = Client(router)
        plain = {served_by(engines, lambda: client.chat("demo-plain", header="h-erin")) for _ in range(6)}
        assert len(plain) == 1, plain  # sticky through the override alone
        cookie = {served_by(engines, lambda: client.chat("demo", cookie="c-frank")) for _ in range(6)}
        assert len(cookie) == 1, cookie
        # the route's own Header source is replaced: a header alone is no key on default/demo
        header = {served_by(engines, lambda: client.chat("demo", header="h-erin")) for _ in range(6)}
        assert len(header) > 1, header
        fams = harness.parse_metrics(router.metrics_text())
        assert harness.metric_value(fams, STICKY, result="hit", model_route="default/demo-plain") == 5
        assert harness.metric_value(fams, STICKY, result="no_key", model_route="default/demo") == 6
    finally:
        router.stop()
