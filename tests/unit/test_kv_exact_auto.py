"""Exact KV-event matching by default (scheduling/exact_auto.py): the kvEvents section,
the rule that decides which pipelines get it, and the scheduler consulting the automatic
matcher only for views with an endpoint that has a stream."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from kthena_router._core import BlockHashes, BranchPoints
from kthena_router.config.errors import ConfigError
from kthena_router.metrics import RouterMetrics
from kthena_router.router_config_reload import build_scheduling
from kthena_router.scheduling.config import KvCacheAwareArgs, load_router_configuration_bytes
from kthena_router.scheduling.exact_auto import auto_exact_args
from kthena_router.scheduling.kv_matcher import KvAwareMatcher, event_source
from kthena_router.scheduling.scheduler import Scheduler
from kthena_router.settings import RouterSettings

from test_scheduling_scheduler import KEY, chat, endpoints, fresh

TOK = """\
  pluginConfig:
  - name: kvcache-aware
    args: {tokenizers: {demo: /nonexistent/tokenizer.json}}
"""
BEST = "scheduler:\n" + TOK + """\
  plugins:
    Score:
      enabled:
      - {name: prefix-cache, weight: 1}
      - {name: least-request, weight: 1}
"""


def load(text: str):  # type: ignore[no-untyped-def]
    return load_router_configuration_bytes(text.encode(), source="rc.yaml")


def test_section_defaults_to_auto_and_accepts_off_spelled_either_way() -> None:
    assert load("{}").kv_events.exact_matching == "auto"
    assert load("kvEvents: {}").kv_events.exact_matching == "auto"
    assert load("kvEvents: {exactMatching: off}").kv_events.exact_matching == "off"  # YAML 1.1: false
    assert load('kvEvents: {exactMatching: "off"}').kv_events.exact_matching == "off"
    assert load("kvEvents: {exactMatching: auto}").kv_events.exact_matching == "auto"


@pytest.mark.parametrize("text, field", [
    ("kvEvents: {exactMatching: sometimes}", "kvEvents.exactMatching"),
    ("kvEvents: {exact: off}", "kvEvents.exact"),
    ("kvEvents: [auto]", "kvEvents"),
    ("kvEvents: {sharedPrefixMemory: sometimes}", "kvEvents.sharedPrefixMemory"),
])
def test_bad_sections_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(text)
    assert f"rc.yaml: document 1: {field}:" in str(e.value)


def test_which_pipelines_get_automatic_exact_matching() -> None:
    rc = load(BEST)
    args = auto_exact_args(rc.scheduler, rc.kv_events)
    assert isinstance(args, KvCacheAwareArgs) and dict(args.tokenizers) == {"demo": "/nonexistent/tokenizer.json"}
    # the built-in default pipeline (no `plugins`) scores prefix-cache too
    assert auto_exact_args(load("scheduler:\n" + TOK).scheduler, rc.kv_events) is not None
    off = load(BEST + "kvEvents: {exactMatching: off}\n")
    assert auto_exact_args(off.scheduler, off.kv_events) is None
    no_tok = load(BEST.replace(TOK, ""))
    assert auto_exact_args(no_tok.scheduler, no_tok.kv_events) is None  # nothing to tokenize with
    no_prefix = load(BEST.replace("      - {name: prefix-cache, weight: 1}\n", ""))
    assert auto_exact_args(no_prefix.scheduler, no_prefix.kv_events) is None  # as written: no matching
    listed = load(BEST.replace("prefix-cache", "kvcache-aware"))
    assert auto_exact_args(listed.scheduler, listed.kv_events) is None  # the plugin itself, not auto


def test_build_scheduling_makes_an_auto_matcher_only_when_the_rule_says_so() -> None:
    settings, m = RouterSettings(config_path="unused"), RouterMetrics(CollectorRegistry())
    for text, auto in ((BEST, True), (BEST + "kvEvents: {exactMatching: off}\n", None),
                       (BEST.replace(TOK, ""), None), (BEST.replace("prefix-cache", "kvcache-aware"), False)):
        rc = load(text)
        sched = build_scheduling(rc.scheduler, rc.source, settings, m, kv_events=rc.kv_events)
        assert (None if sched.matcher is None else sched.matcher.auto) == auto, text
        assert sched.scheduler.kv_matcher is sched.matcher


def test_shared_prefix_memory_is_on_for_automatic_matching_unless_said_otherwise() -> None:
    settings, m = RouterSettings(config_path="unused"), RouterMetrics(CollectorRegistry())
    listed = BEST.replace("prefix-cache", "kvcache-aware")
    for text, branches in ((BEST, True), (BEST + "kvEvents: {sharedPrefixMemory: false}\n", False),
                           (listed, False),  # the listed plugin scores as Kthena's does
                           (listed + "kvEvents: {sharedPrefixMemory: true}\n", True)):
        rc = load(text)
        sched = build_scheduling(rc.scheduler, rc.source, settings, m, kv_events=rc.kv_events)
        assert sched.matcher is not None
        assert (sched.matcher.branches is not None) == branches, text


def test_auto_sources_only_labelled_endpoints() -> None:
    args = KvCacheAwareArgs()
    assert event_source("10.0.0.1", {}, args) is not None  # the plugin: its default ports
    assert event_source("10.0.0.1", {}, args, labelled_only=True) is None
    src = event_source("10.0.0.1", {"kthena.io/kv-events-port": "7000"}, args, labelled_only=True)
    assert src is not None and src.pub == "tcp://10.0.0.1:7000"


class Stub:
    """A matcher that records its calls and claims endpoint 1 holds everything."""

    def __init__(self, s: Scheduler, eps) -> None:  # type: ignore[no-untyped-def]
        self.sourced: frozenset[int] = frozenset()
        self.generation = 0
        self.calls = 0
        self.prepared = 0
        self.target = s.endpoint_id(eps[1].key)

    async def prepare(self, info) -> None:  # type: ignore[no-untyped-def]
        self.prepared += 1

    def match(self, info, approx, total):  # type: ignore[no-untyped-def]
        self.calls += 1
        return [(self.target, 10)], 10


def test_scheduler_consults_the_auto_matcher_only_for_views_with_a_stream() -> None:
    import asyncio

    cfg = load(BEST).scheduler
    s = Scheduler(cfg, RouterMetrics(CollectorRegistry()))
    eps = endpoints(3)
    fresh(s, eps)
    stub = Stub(s, eps)
    s.set_kv_matcher(stub)  # type: ignore[arg-type]
    for i in range(5):
        info = chat(f"a{i}", "q")
        asyncio.run(s.prepare(info))
        s.candidates(KEY, eps, info)
    assert stub.calls == 0 and stub.prepared == 0  # no endpoint publishes: the default path only
    stub.sourced, stub.generation = frozenset({stub.target}), 1
    for i in range(5):
        info = chat(f"b{i}", "q")
        asyncio.run(s.prepare(info))
        assert s.candidates(KEY, eps, info)[0] is eps[1]
    assert stub.calls == 5 and stub.prepared == 5
    stub.sourced, stub.generation = frozenset({99}), 2  # an endpoint of another view
    s.candidates(KEY, eps, chat("c", "q"))
    assert stub.calls == 5


def test_prepare_is_needed_only_with_a_matcher_in_play_and_a_long_prompt() -> None:
    """The Rust front decides without a task when prepare() has nothing to await."""
    from kthena_router.scheduling.kv_matcher import OFFLOAD_CHARS

    s = Scheduler(load(BEST).scheduler, RouterMetrics(CollectorRegistry()))
    eps = endpoints(3)
    fresh(s, eps)
    assert not s.prepare_needed(chat("n", "q"))  # no matcher
    stub = Stub(s, eps)
    s.set_kv_matcher(stub)  # type: ignore[arg-type]
    assert not s.prepare_needed(chat("s", "q"))  # nothing publishes: the matcher is not consulted
    stub.sourced = frozenset({stub.target})
    assert s.prepare_needed(chat("t", "q"))  # a matcher without prepare_needed: always awaited
    m = KvAwareMatcher(KvCacheAwareArgs(), RouterMetrics(CollectorRegistry()), auto=True)
    m.sourced = frozenset({stub.target})  # type: ignore[misc]
    s.set_kv_matcher(m)
    assert not s.prepare_needed(chat("u", "q"))  # a short prompt: tokenized inline by match()
    assert s.prepare_needed(chat("v", "x" * OFFLOAD_CHARS))


def test_matcher_keeps_the_approximate_match_of_endpoints_without_an_up_stream() -> None:
    m = KvAwareMatcher(KvCacheAwareArgs(), RouterMetrics(CollectorRegistry()), auto=True)
    m._up = {1}  # endpoint 1's stream is up; 2 has none, 3 is not subscribed at all
    info = chat("r", "q")
    info.tokens, info.tokens_ready = list(range(64)), True  # 4 blocks of 16 tokens
    matches, total = m.match(info, [(1, 8), (2, 8), (3, 4)], 8)  # approximate: byte blocks
    assert total == 4
    assert sorted(matches) == [(2, 4), (3, 2)]  # rescaled; nothing approximate for the up one


def test_shared_prefixes_keep_the_approximate_memory_private_contexts_do_not() -> None:
    m = KvAwareMatcher(KvCacheAwareArgs(), RouterMetrics(CollectorRegistry()), auto=True)
    m.branches = BranchPoints(1 << 10)
    m._up = {1, 2}  # both streams up; the engines' tables hold nothing (evicted)

    def ask(hashes: list[int], approx: list[tuple[int, int]]) -> list[tuple[int, int]]:
        info = chat("r", "q")
        info.tokens, info.tokens_ready = list(range(64)), True  # 4 token blocks
        info.hashes = BlockHashes(hashes)
        matches, total = m.match(info, approx, len(hashes))
        assert total == 4
        return sorted(matches)

    group = [1, 2, 3, 4, 5, 6]  # a shared system prompt: two questions follow it
    assert ask(group + [7, 8], []) == []
    assert ask(group + [90, 91], [(1, 8)]) == [(1, 3)]  # raised to the shared 6 of 8 blocks
    assert ask(group + [70, 71], [(1, 5)]) == []  # the index's run stops short of the branch
    session = [200, 201, 202, 203, 204, 205, 206, 207]  # each turn extends the last
    assert ask(session, [(2, 6)]) == []
    assert ask(session + [208, 209], [(2, 8)]) == []  # private: exact only, placed by load
    m.branches = None
    assert ask(group + [40, 41], [(1, 8)]) == []  # without the memory: exact only
