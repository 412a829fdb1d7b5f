"""The PD pairer's side schedulers share their dispatch-time prefix inserts as the plain
scheduler does (scheduling/insert_scopes.py): through the pod-state hub between the
workers of one router, and through Redis (sharedPrefixIndex) between replicas.

Engines: 0-2 prefill, 3 decode, one group (Kthena's http connector: two ordinary
requests). The prefill side scores prefix-cache well above least-request, so a prompt
whose prefix another worker or replica sent to a prefill engine goes there again; the
first round is sent all at once, so least-request spreads the new prefixes over the
three prefill engines and a worker or replica that did not learn them could only match
them by chance (1/3 per group). Which prefill engine served a request: the simulator's
request log, keyed by the X-Request-ID the router forwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness
import pd_harness as pdh
import redis_harness

GROUPS = 8
PREFILLS = (0, 1, 2)
PD = """\
scheduler:
  plugins:
    Score:
      enabled:
      - {{name: prefix-cache, weight: 1}}
      - {{name: least-request, weight: 1}}
pd:
  prefill:
    plugins:
      Score:
        enabled:
        - {{name: prefix-cache, weight: 10}}
        - {{name: least-request, weight: 1}}
{extra}"""
SHARED = """\
sharedPrefixIndex:
  redis: {{address: "{address}"}}
  syncInterval: 20ms
"""


def pd_config(sim: harness.Simulator) -> list[dict[str, Any]]:
    p = sim.ports
    return [harness.route_doc("pd", "demo", "pd"), pdh.pd_server("pd", {"app": "pd"}),
            pdh.endpoints("pd-engines", [(p[i], {"app": "pd", "group": "a", "role": "prefill"}, None) for i in PREFILLS]
                          + [(p[3], {"app": "pd", "group": "a", "role": "decode"}, None)])]


def messages(tag: str, g: int) -> list[dict[str, str]]:
    system = f"You are the assistant of team {tag}-{g}. " + "Answer briefly and cite the house rules. " * 30
    return [{"role": "system", "content": system}, {"role": "user", "content": "what now?"}]


def send(router: harness.Router, tag: str, id_tag: str, together: bool = False) -> None:
    """One request per group; a new connection each (a router's workers take turns)."""
    def one(g: int) -> None:
        with httpx.Client(timeout=60) as c:
            r = c.post(router.base_url + "/v1/chat/completions", headers={"x-request-id": f"{id_tag}{g}"},
                       json={"model": "demo", "max_tokens": 2, "messages": messages(tag, g)})
        assert r.status_code == 200, r.text
    if together:
        with ThreadPoolExecutor(GROUPS) as pool:
            list(pool.map(one, range(GROUPS)))
    else:
        for g in range(GROUPS):
            one(g)


def prefill_engines(sim: harness.Simulator, id_tag: str) -> list[int]:
    out = []
    for g in range(GROUPS):
        seen = pdh.hops(sim, f"{id_tag}{g}")
        (p,) = [i for i in seen if i in PREFILLS]  # exactly one prefill hop per request
        assert 3 in seen, seen
        out.append(p)
    return out


def start_sim(tmp: Path) -> harness.Simulator:
    # a 300 ms prefill: requests sent together overlap, so least-request spreads them
    return harness.start_simulator(tmp, engines=4, fast=True, extra_args=[
        "--roles", "prefill,prefill,prefill,decode", "--fast-ttft-ms", "300"])


def start(sim: harness.Simulator, tmp: Path, rc_text: str, workers: int) -> harness.Router:
    config = harness.write_config(tmp / "routes.yaml", pd_config(sim))
    rc = harness.write_config(tmp / "router-config.yaml", rc_text)
    return harness.start_router(config, tmp, workers=workers, extra_args=["--router-config", str(rc)])


def pd_views(router: harness.Router) -> list[dict[str, Any]]:
    r = router.admin_get("/debug/pd")
    assert r.status_code == 200, r.text
    return list(r.json()["workers"])


def test_workers_via_hub(tmp_path: Path) -> None:
    """Two workers + hub: a prompt dispatched by one worker goes to the same prefill engine
    from the other (short test names: the workers' debug sockets live under tmp_path)."""
    with start_sim(tmp_path) as sim, start(sim, tmp_path, PD.format(extra=""), workers=2) as router:
        harness.wait_until(lambda: len(pd_views(router)) == 2, 30, what="two workers")
        send(router, "p", "a", together=True)
        chosen = prefill_engines(sim, "a")
        assert len(set(chosen)) >= 2, chosen  # spread: a worker's own tie-break cannot reproduce it
        # every worker's prefill index holds every prefill engine's prefixes, whichever
        # worker dispatched them (relayed by the hub)
        want = {f"{harness.HOST}:{sim.ports[i]}" for i in set(chosen)}
        harness.wait_until(lambda: all(set(v["index"]["prefill"]) >= want for v in pd_views(router)), 30,
                           what=f"both workers' prefill indexes hold {sorted(want)}")
        for rnd in range(3):  # each worker takes some of these (connections alternate)
            send(router, "p", f"b{rnd}-")
            assert prefill_engines(sim, f"b{rnd}-") == chosen, rnd


@pytest.fixture()
def redis(tmp_path: Path) -> Iterator[redis_harness.RedisServer]:
    r = redis_harness.start_redis(tmp_path)
    try:
        yield r
    finally:
        r.stop()


def test_replicas_via_redis(tmp_path: Path, redis: redis_harness.RedisServer) -> None:
    """Two replicas + a real redis-server: B sends A's prompts to A's prefill engines."""
    rc = PD.format(extra=SHARED.format(address=redis.address))
    with start_sim(tmp_path) as sim, start(sim, tmp_path / "a", rc, 1) as a, start(sim, tmp_path / "b", rc, 1) as b:
        send(a, "q", "a", together=True)
        chosen = prefill_engines(sim, "a")
        assert len(set(chosen)) >= 2, chosen
        # each request: one decode-side and one prefill-side record (plus none from the
        # plain scheduler: PD requests do not pass it)
        harness.wait_until(lambda: pdh.metric(b, "kthena_router_shared_index_merged_total") >= 2 * GROUPS, 30,
                           what="B merged A's PD dispatches")
        prefill_keys = {f"{harness.HOST}:{sim.ports[i]}" for i in set(chosen)}
        (view,) = pd_views(b)
        assert set(view["index"]["prefill"]) >= prefill_keys, view["index"]
        send(b, "q", "b")
        assert prefill_engines(sim, "b") == chosen
