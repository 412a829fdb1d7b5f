"""sharedPrefixIndex end to end: real redis-server, real routers, the simulator, the OpenAI SDK.

Two replicas share dispatch-time prefix ownership through Redis: prompts first sent to
replica A are routed by replica B to the engines A chose (B never saw them; A's choices are
spread over the engines, sent together, so B's own tie-break cannot reproduce them).
Prefix-cache outweighs least-request here: a load snapshot B scraped while A's requests
ran must not pull B off the prefix's engine (this test is about sharing, not balance).
Every router has scraped every engine before the first request (/readyz waits for it,
warmup.py): an endpoint not scraped yet is stale (load unknown = worst), so least-request
gives it nothing and the hot-spot guard moves even an exact prefix match off it; a burst
right after start would pile on the engines scraped first.
Redis killed: routing continues on each replica's local index (requests succeed, local
affinity holds), the outage shows in the metrics; Redis back: the dispatches buffered
meanwhile reach the other replica. Which engine served a request: the simulator's
request log (keyed by the X-Request-ID the router forwards).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

import harness
import redis_harness

GROUPS = 8
SCHED = """\
scheduler:
  plugins:
    Score:
      enabled:
      - {{name: prefix-cache, weight: 10}}
      - {{name: least-request, weight: 1}}
sharedPrefixIndex:
  redis: {{address: "{address}"}}
  syncInterval: 20ms
  redisTimeout: 1s
  redisRetry: 300ms
"""


def messages(tag: str, group: int) -> list[dict[str, str]]:
    system = f"You are the assistant of team {tag}-{group}. " + "Answer briefly and cite the house rules. " * 30
    return [{"role": "system", "content": system}, {"role": "user", "content": "what now?"}]


def send(router: harness.Router, prompt_tag: str, id_tag: str, together: bool = False) -> None:
    """The groups one after another, or all at once (`together`: least-request then spreads the
    new prefixes over the engines by their in-flight counts, whatever the tie-break)."""
    with router.openai(max_retries=0, timeout=60) as client:
        def one(g: int) -> None:
            r = client.chat.completions.create(model="demo", messages=messages(prompt_tag, g), max_tokens=2,
                                               extra_headers={"x-request-id": f"{id_tag}{g}"})
            assert r.choices[0].message.content
        if together:
            with ThreadPoolExecutor(GROUPS) as pool:
                list(pool.map(one, range(GROUPS)))
        else:
            for g in range(GROUPS):
                one(g)


def engines(sim: harness.Simulator, id_tag: str) -> list[int]:
    where = {row["request_id"]: i for i in range(len(sim.ports)) for row in sim.requests(i)["log"]}
    return [where[f"{id_tag}{g}"] for g in range(GROUPS)]


def metric(router: harness.Router, name: str) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), name)


def scraped_all(router: harness.Router, sim: harness.Simulator) -> bool:
    """The router holds a good scrape of every engine (kthena_router_endpoint_metrics_stale
    appears with a first scrape and is 0 while the last one succeeded)."""
    stale = {s.labels["endpoint"]: s.value
             for fam in harness.parse_metrics(router.metrics_text()).values() for s in fam.samples
             if s.name == "kthena_router_endpoint_metrics_stale"}
    return all(stale.get(f"{harness.HOST}:{p}") == 0 for p in sim.ports)


@pytest.fixture()
def setup(tmp_path: Path) -> Iterator[tuple[harness.Simulator, redis_harness.RedisServer, list[harness.Router]]]:
    redis = redis_harness.start_redis(tmp_path)
    # a 300 ms first token: requests sent together overlap, so their in-flight counts spread them
    sim = harness.start_simulator(tmp_path, engines=3, fast=True, extra_args=["--fast-ttft-ms", "300"])
    config = harness.write_config(tmp_path / "config.yaml", harness.engine_config(sim.ports))
    sched = harness.write_config(tmp_path / "sched.yaml", SCHED.format(address=redis.address))
    routers = [harness.start_router(config, tmp_path, extra_args=["--router-config", str(sched)], wait=False)
               for _ in range(2)]
    try:
        for r in routers:
            r.wait_ready()
            assert scraped_all(r, sim), "ready before its first scrape of every engine"
        yield sim, redis, routers
    finally:
        for r in routers:
            r.stop()
        sim.stop()
        redis.stop()


def test_a_replica_routes_prefixes_to_the_engines_another_replica_chose(setup) -> None:  # type: ignore[no-untyped-def]
    sim, _, (a, b) = setup
    send(a, "p", "a", together=True)
    chosen = engines(sim, "a")
    assert len(set(chosen)) >= 2, chosen  # the prefixes spread (else the check below is weak)
    harness.wait_until(lambda: metric(b, "kthena_router_shared_index_merged_total") >= GROUPS, 30,
                       what="B merged A's dispatches")
    assert metric(a, "kthena_router_shared_index_published_total") >= GROUPS
    # one round trip that outlasted redisTimeout on a busy machine marks Redis down for
    # redisRetry; what must hold is that A is (back) up, not that no call was ever slow
    harness.wait_until(lambda: metric(a, "kthena_router_shared_index_redis_up") == 1, 30, what="A sees Redis up")
    send(b, "p", "b")
    assert engines(sim, "b") == chosen


def test_redis_down_routing_continues_on_the_local_index(setup) -> None:  # type: ignore[no-untyped-def]
    sim, redis, (a, b) = setup
    redis.kill()
    send(a, "q", "a", together=True)  # every request succeeds (send asserts it)
    chosen = engines(sim, "a")
    harness.wait_until(lambda: metric(a, "kthena_router_shared_index_redis_up") == 0, 30, what="A sees Redis down")
    assert metric(a, "kthena_router_shared_index_redis_errors_total") >= 1
    send(a, "q", "a2")  # A's own index still gives affinity
    assert engines(sim, "a2") == chosen
    assert metric(b, "kthena_router_shared_index_merged_total") == 0
    redis.start()  # same port, empty: A's buffered dispatches are published on its next round
    harness.wait_until(lambda: metric(b, "kthena_router_shared_index_merged_total") >= GROUPS, 30,
                       what="B merged what A buffered during the outage")
    harness.wait_until(lambda: metric(a, "kthena_router_shared_index_redis_up") == 1, 30, what="A sees Redis up")
    send(b, "q", "b")
    assert engines(sim, "b") == chosen


def _stream_len(redis: redis_harness.RedisServer, key: str) -> int:
    import redis as redis_py  # the client library, for a direct look at the stream

    with redis_py.Redis(host=redis.address.split(":")[0], port=int(redis.address.split(":")[1])) as r:
        return int(r.xlen(key))


def test_reload_moves_the_sync_to_a_new_key_and_a_removal_stops_it(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim, redis, (a, _) = setup
    send(a, "r", "a")
    harness.wait_until(lambda: _stream_len(redis, "kthena:prefix-index") > 0, 30, what="the default stream")
    sched = tmp_path / "sched.yaml"
    sched.write_text(SCHED.format(address=redis.address) + "  key: fleet-b\n")
    assert a.reload().status_code == 200
    published = metric(a, "kthena_router_shared_index_published_total")
    send(a, "s", "a2")
    harness.wait_until(lambda: _stream_len(redis, "fleet-b") > 0, 30, what="the new key after the reload")
    assert metric(a, "kthena_router_shared_index_published_total") > published
    # the section removed: no more publishing, routing goes on with the local index
    sched.write_text(SCHED.format(address=redis.address).split("sharedPrefixIndex:")[0])
    assert a.reload().status_code == 200
    send(a, "t", "a3")  # by its end a retired sync has long flushed what it held (20 ms rounds)
    before = {k: _stream_len(redis, k) for k in ("kthena:prefix-index", "fleet-b")}
    send(a, "t", "a4")
    send(a, "u", "a5")  # 16 dispatches: a running sync would publish them round by round
    assert engines(sim, "a4") == engines(sim, "a3")  # local affinity
    assert {k: _stream_len(redis, k) for k in before} == before
    assert a.stop() == 0  # a clean, prompt shutdown after the sync was stopped


def test_a_routers_workers_count_each_others_dispatches_once(tmp_path: Path) -> None:
    """Several workers: the pod-state hub relays a worker's inserts to its siblings, so they
    skip the same records coming back from Redis (which balanceMisses' traffic counters
    would count twice); another router still merges them."""
    redis = redis_harness.start_redis(tmp_path)
    sim = harness.start_simulator(tmp_path, engines=3, fast=True, extra_args=["--fast-ttft-ms", "300"])
    config = harness.write_config(tmp_path / "config.yaml", harness.engine_config(sim.ports))
    sched = harness.write_config(tmp_path / "sched.yaml", SCHED.format(address=redis.address))
    routers: list[harness.Router] = []
    try:
        for workers in (2, 1):
            routers.append(harness.start_router(config, tmp_path, workers=workers,
                                                extra_args=["--router-config", str(sched)]))
        a, b = routers
        harness.wait_until(lambda: all(w["mode"] == "hub" for w in a.admin_get("/debug/pod_state").json()["workers"]),
                           30, what="A's workers on the hub")
        send(a, "w", "a", together=True)
        harness.wait_until(lambda: metric(b, "kthena_router_shared_index_merged_total") >= GROUPS, 30,
                           what="B merged A's dispatches")
        harness.wait_until(lambda: metric(a, "kthena_router_shared_index_same_pod_total") >= 1, 30,
                           what="A's workers skipped each other's entries")
        applied = sum(w["inserts_applied"] for w in a.admin_get("/debug/pod_state").json()["workers"])
        assert applied >= GROUPS  # each dispatch reached the other worker once, from the hub
        assert metric(a, "kthena_router_shared_index_merged_total") == 0
    finally:
        for r in routers:
            r.stop()
        sim.stop()
        redis.stop()
