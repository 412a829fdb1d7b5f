"""Shared waits and diagnostics of the KV-event routing tests (exact matching by default,
PD sides): what they rely on before routing, and what the router saw when they fail."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

import harness

TOKENIZER = harness.REPO / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
# A prefix-cache + least-request router configuration with kvcache-aware's tokenizers, so
# exact matching is automatic (format with tok=TOKENIZER and extra= further sections).
# prefix-cache outweighs least-request: at equal weights one request's difference in the
# scraped load (e.g. a scrape taken during a direct warm-up) outweighs a whole prefix, and
# these tests are about where the prefix match comes from, not about weights.
AUTO_CONFIG = """\
scheduler:
  pluginConfig:
  - name: kvcache-aware
    args:
      tokenizers: {{demo: {tok}}}
      hashSeed: "0"
  plugins:
    Score:
      enabled:
      - {{name: prefix-cache, weight: 3}}
      - {{name: least-request, weight: 1}}
{extra}"""


def labelled_config_docs(ports: list[int], kv_base: int) -> list[dict[str, Any]]:
    """Route + ModelServer + Endpoints whose labels name each engine's KV-event ports."""
    labels = {"app": "demo"}
    eps = [{"address": harness.HOST, "port": p,
            "labels": {**labels, "kthena.io/kv-events-port": str(kv_base + 2 * i),
                       "kthena.io/kv-events-replay-port": str(kv_base + 2 * i + 1)}}
           for i, p in enumerate(ports)]
    return [harness.route_doc("demo", "demo", "demo"), harness.server_doc("demo", "demo", labels),
            {"apiVersion": harness.ENDPOINTS_API, "kind": "Endpoints", "metadata": {"name": "demo-engines"},
             "spec": {"endpoints": eps}}]


def ownership(router: harness.Router) -> dict[str, Any]:
    """The matcher's view per endpoint (/debug/kv_ownership, admin port; one worker)."""
    r = router.admin_get("/debug/kv_ownership")
    r.raise_for_status()
    return dict(r.json()["workers"][0]["endpoints"])


def messages(tag: str, g: int) -> list[dict[str, str]]:
    """Group g's chat: a system prompt of its own. Tags starting with "L": prompts over
    kv_matcher.OFFLOAD_CHARS (tokenized in prepare())."""
    rules = "Answer briefly and cite the house rules. " * (220 if tag.startswith("L") else 40)
    system = f"You are the assistant of team {tag}-{g}. " + rules
    return [{"role": "system", "content": system}, {"role": "user", "content": "what now?"}]


def post(url: str, tag: str, g: int, rid: str) -> None:
    with httpx.Client(timeout=60) as c:
        r = c.post(url + "/v1/chat/completions", headers={"x-request-id": rid},
                   json={"model": "demo", "max_tokens": 2, "messages": messages(tag, g)})
    assert r.status_code == 200, r.text


COUNTERS = ("batches", "gaps", "gaps_unrecovered", "replays", "connects", "decode_errors")


def engine_cache(sim: harness.Simulator, i: int) -> dict[str, Any]:
    """Engine i's true cache as event hashes, with the last batch it published."""
    r = httpx.get(f"{sim.admin_url}/admin/engines/{i}/cache", timeout=30)
    r.raise_for_status()
    (rank0,) = r.json()
    return dict(rank0)


def _count(blocks: Any) -> int:
    return blocks if isinstance(blocks, int) else len(blocks or [])


def brief(entry: dict[str, Any] | None) -> dict[str, Any]:
    """One endpoint of a matcher's debug view without its block list."""
    if entry is None:
        return {}
    return {"state": entry.get("state"), "last_seq": entry.get("last_seq"), "blocks": _count(entry.get("blocks")),
            **{k: entry[k] for k in COUNTERS if k in entry}}


def wait_table_is_engine_cache(sim: harness.Simulator, i: int, entry: Callable[[], dict[str, Any] | None]) -> None:
    """Until the router's table for engine i (`entry()`: its debug-view entry) holds exactly
    the engine's cached blocks, after the engine's last batch: what exact matching routes
    on. A router that lost events never gets there, and the message says how."""
    def same() -> bool:
        e, cache = entry(), engine_cache(sim, i)
        if e is None or (e["last_seq"] or 0) < cache["last_seq"]:
            return False
        if isinstance(e["blocks"], int):  # a view that gives only the count (/debug/pd)
            return e["blocks"] == len(cache["blocks"])
        return set(e["blocks"]) == set(cache["blocks"])

    def state() -> str:
        e, cache = entry(), engine_cache(sim, i)
        held = set(cache["blocks"])
        got = (e or {}).get("blocks", [])
        diff = "" if isinstance(got, int) else f", {len(held - set(got))} missing, {len(set(got) - held)} extra"
        return f"engine {i}: {len(held)} blocks, last batch {cache['last_seq']}; router: {brief(e)}{diff}"

    try:
        harness.wait_until(same, 30, interval=0.1, what=f"router's table equal to engine {i}'s cache")
    except TimeoutError:
        raise AssertionError(f"the router's table never matched the engine's cache: {state()}") from None


def engine_view(router: harness.Router, keys: list[str]) -> dict[str, tuple[float, float]]:
    """{endpoint: (healthy, metrics stale)} as the router sees them."""
    fams = harness.parse_metrics(router.metrics_text())
    return {k: (harness.metric_value(fams, "kthena_router_endpoint_healthy", endpoint=k),
                harness.metric_value(fams, "kthena_router_endpoint_metrics_stale", endpoint=k)) for k in keys}


def wait_engines_fresh(router: harness.Router, keys: list[str]) -> None:
    """Every engine a candidate with a fresh scrape: a stale one counts as the most loaded,
    which on a loaded machine can outweigh its prefix match."""
    harness.wait_until(lambda: set(engine_view(router, keys).values()) == {(1.0, 0.0)}, 30,
                       interval=0.1, what="every engine healthy and freshly scraped")


def wait_rescraped(sim: harness.Simulator, engines: list[int], scrapes: int = 4) -> None:
    """Until each engine served `scrapes` more /metrics requests: with two routers scraping
    every second, each has scraped every engine since the direct warm-up traffic, which a
    scrape taken during it shows as running there (least-request then ranks that engine
    worst, enough to outweigh a whole prefix at equal weights)."""
    def polls() -> list[int]:
        return [int(sim.state(i)["polls"]["metrics"]) for i in engines]

    start = polls()
    harness.wait_until(lambda: all(b >= a + scrapes for a, b in zip(start, polls())), 30, interval=0.1,
                       what=f"{scrapes} scrapes of engines {engines} after the warm-up")
