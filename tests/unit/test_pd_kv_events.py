"""Exact KV-event matching on the PD sides (pd/side_kv.py, pd/config_parse.with_kv_events):
which side gets a matcher (listed, automatic, off), where its arguments come from, that it
follows exactly its own side's endpoints, that a reload rebuilds only the side whose mode
changed, and that the scheduler section's matcher leaves PD servers' endpoints alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from kthena_router._core import PrefixIndex
from kthena_router.metrics import RouterMetrics
from kthena_router.pd.config_parse import side_settings
from kthena_router.pd.pairing import PdPairer
from kthena_router.router_config_reload import _kv_sources, build_scheduling
from kthena_router.scheduling.config import KvCacheAwareArgs, load_router_configuration_bytes
from kthena_router.scheduling.kv_matcher import KvAwareMatcher
from kthena_router.settings import RouterSettings

from pd_fixtures import ep, pd_state
from test_scheduling_scheduler import chat

TOK = "{demo: /nonexistent/tokenizer.json}"
SCHED_TOK = f"""\
scheduler:
  pluginConfig:
  - name: kvcache-aware
    args: {{tokenizers: {TOK}, hashSeed: "7"}}
"""
KV = {"kthena.io/kv-events-port": "6000"}


def load(text: str):  # type: ignore[no-untyped-def]
    return load_router_configuration_bytes(text.encode(), source="rc.yaml")


def pairer(text: str) -> PdPairer:
    return PdPairer(load(text).pd, RouterMetrics(CollectorRegistry()))


def matcher(p: PdPairer, side: str) -> KvAwareMatcher | None:
    m = (p.decode if side == "decode" else p.prefill).inner.kv_matcher
    assert m is None or isinstance(m, KvAwareMatcher)
    return m


def test_the_default_prefill_side_gets_automatic_matching_with_the_scheduler_sections_tokenizers() -> None:
    p = pairer(SCHED_TOK)
    m = matcher(p, "prefill")
    assert m is not None and m.auto
    assert dict(m.args.tokenizers) == {"demo": "/nonexistent/tokenizer.json"} and m.args.hash_seed == "7"
    assert matcher(p, "decode") is None  # the default decode pipeline scores no prefix: nothing to match


def test_off_and_no_tokenizers_leave_the_sides_approximate() -> None:
    assert matcher(pairer(SCHED_TOK + "kvEvents: {exactMatching: off}\n"), "prefill") is None
    assert matcher(pairer("pd: {}\n"), "prefill") is None  # no tokenizers anywhere: no matcher at all
    assert matcher(pairer("scheduler: {}\n"), "prefill") is None


def test_a_side_that_lists_kvcache_aware_follows_every_endpoint_even_when_off() -> None:
    text = SCHED_TOK + """\
kvEvents: {exactMatching: off}
pd:
  decode:
    plugins: {Score: {enabled: [{name: kvcache-aware, weight: 1}, {name: least-request, weight: 1}]}}
"""
    p = pairer(text)
    d = matcher(p, "decode")
    assert d is not None and not d.auto and d.args.hash_seed == "7"
    assert matcher(p, "prefill") is None  # off: the prefill side's prefix-cache stays approximate


def test_a_sides_own_plugin_config_wins_over_the_scheduler_sections() -> None:
    text = SCHED_TOK + """\
pd:
  prefill:
    pluginConfig:
    - name: kvcache-aware
      args: {tokenizers: {other: /x/tokenizer.json}, hashSeed: "9"}
"""
    rc = load(text)
    m = matcher(PdPairer(rc.pd, RouterMetrics(CollectorRegistry())), "prefill")
    assert m is not None and m.args.hash_seed == "9" and list(m.args.tokenizers) == ["other"]
    # the decode side has no entry of its own: it inherits (used if it ever lists the plugin)
    assert side_settings(rc.pd, "decode").args["kvcache-aware"].hash_seed == "7"


def test_each_side_follows_only_its_own_labelled_endpoints(tmp_path: Path) -> None:
    asyncio.run(_follows(tmp_path))  # subscriptions are tasks: a running loop


async def _follows(tmp_path: Path) -> None:
    p = pairer(SCHED_TOK + "pd:\n  decode:\n    plugins: {Score: {enabled: [{name: prefix-cache, weight: 1}]}}\n")
    state = pd_state(tmp_path, [ep(9001, "a", "prefill", **KV), ep(9002, "a", "decode", **KV),
                                ep(9003, "b", "prefill"), ep(9004, "b", "decode", **KV)])
    p.on_state(state)
    pm, dm = matcher(p, "prefill"), matcher(p, "decode")
    assert pm is not None and dm is not None
    assert set(pm.ids) == {"127.0.0.1:9001"}  # 9003 advertises no stream: approximate only
    assert set(dm.ids) == {"127.0.0.1:9002", "127.0.0.1:9004"}
    assert p.kv_streams_not_up() == {"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9004"}  # none connected
    assert p.debug_view()["kv_events"]["prefill"]["endpoints"]["127.0.0.1:9001"]["blocks"] == 0
    # the scheduler section's matcher never routes a PD server: it does not subscribe there
    main = build_scheduling(load(SCHED_TOK + "  plugins: {Score: {enabled: [{name: prefix-cache, weight: 1}]}}\n"
                                 ).scheduler, "rc.yaml", RouterSettings(config_path="unused"), RouterMetrics(CollectorRegistry()))
    main.scheduler.sync(state.targets)
    assert main.matcher is not None and _kv_sources(state, main.scheduler, main.matcher.args, True) == {}
    await p.close()


def test_a_reload_rebuilds_only_the_side_whose_exact_mode_changed() -> None:
    p = pairer(SCHED_TOK)
    off = load(SCHED_TOK + "kvEvents: {exactMatching: off}\n")
    build = p.build(off.pd, "rc.yaml")
    assert build.decode is None  # no prefix plugin: the same with or without exact matching
    assert build.prefill is not None and build.prefill.kv_matcher is None
    p.install(build)
    assert matcher(p, "prefill") is None
    back = p.build(load(SCHED_TOK).pd, "rc.yaml")
    assert back.decode is None and back.prefill is not None and back.prefill.kv_matcher is not None
    p.install(back)
    m = matcher(p, "prefill")
    assert m is not None and m.branches is not None  # automatic: shared prefixes keep memory
    # turning the shared-prefix memory off alone rebuilds the side (it is not ignored)
    plain = p.build(load(SCHED_TOK + "kvEvents: {sharedPrefixMemory: false}\n").pd, "rc.yaml")
    assert plain.decode is None and plain.prefill is not None
    assert plain.prefill.kv_matcher is not None and plain.prefill.kv_matcher.branches is None


def test_a_recent_dispatch_counts_for_an_up_endpoint_until_its_events_arrive() -> None:
    """kv_matcher.RECENT_S: a prompt just sent to an endpoint whose stream is up is not in
    its events yet; the exact match must not call that endpoint empty meanwhile."""
    m = KvAwareMatcher(KvCacheAwareArgs(), RouterMetrics(CollectorRegistry()), auto=True)
    assert m.recent_s == 0  # off by default (kv_matcher.RECENT_S)
    m.recent_s = 4.0
    m._up = {1, 2}
    hashes, _ = PrefixIndex(100).match_prompt(b"x" * 64 * 8, 64, 0, 100)  # 8 byte blocks
    info = chat("r", "q")
    info.tokens, info.tokens_ready, info.hashes = list(range(64)), True, hashes  # 4 token blocks
    assert m.match(info, [], 8) == ([], 4)  # nothing dispatched, nothing published
    m.dispatched(1, hashes)
    m.dispatched(3, hashes)  # not an up endpoint: its approximate match is used anyway
    assert m.match(info, [], 8) == ([(1, 4)], 4)
    m.recent_s = 1e-9  # two periods later both generations are gone
    m._rotated -= 1.0
    assert m.match(info, [], 8) == ([], 4)
