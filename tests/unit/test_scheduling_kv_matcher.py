"""KvAwareMatcher: local tokenization (chat template + tokenizer.json) -> vLLM block hashes
-> Rust ownership match, stream-down fallback and its metric."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from prometheus_client import CollectorRegistry

from kthena_router.kv_events import EventSource
from kthena_router.kv_events.hashing import BlockHasher
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.config import KvCacheAwareArgs
from kthena_router.scheduling.kv_matcher import KvAwareMatcher, event_source
from kthena_router.scheduling.request import RequestInfo
from loadtest.simulator.tokenizer import load_codec, render_chat

TOKENIZER = Path(__file__).resolve().parents[2] / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
NOWHERE = EventSource("tcp://127.0.0.1:9", None)  # never connects: streams stay down until told


def make() -> tuple[KvAwareMatcher, RouterMetrics]:
    args = KvCacheAwareArgs(tokenizers=MappingProxyType({"demo": str(TOKENIZER)}), hash_seed="0")
    metrics = RouterMetrics(CollectorRegistry())
    return KvAwareMatcher(args, metrics), metrics


def fallbacks(metrics: RouterMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("kthena_router_kvcache_aware_fallback_total",
                                             {"model": "demo", "reason": reason}) or 0.0


def chat(text: str, model: str = "demo") -> RequestInfo:
    body = {"model": model, "messages": [{"role": "system", "content": text}, {"role": "user", "content": "q?"}]}
    return RequestInfo("r1", "/v1/chat/completions", body, model, "", model)


def engine_hashes(info: RequestInfo) -> list[int]:
    """What the simulator would cache for this request: its template, its tokenizer."""
    codec = load_codec()
    ids = codec.encode(render_chat(info.obj["messages"]), False)
    return BlockHasher(16, "sha256_cbor", "0").hashes(ids)


async def test_exact_match_follows_the_engines_tokens_and_falls_back_when_down() -> None:
    m, metrics = make()
    m.set_endpoints({"a:1": (1, NOWHERE), "b:1": (2, NOWHERE)})
    sink = m.subscribers.sink
    try:
        info = chat("You are a helpful assistant. " * 60)
        want = engine_hashes(info)
        assert len(want) > 10
        sink.set_stream_up("a:1", True)
        sink.set_stream_up("b:1", True)
        sink.stored("a:1", want[:7])  # engine a holds the first 7 blocks
        assert m.match(info, None, 0) == ([(1, 7)], len(want))
        assert fallbacks(metrics, "stream_down") == 0
        # b's stream goes down: its (rescaled) approximate match is used, and counted
        sink.set_stream_up("b:1", False)
        matches, n = m.match(info, [(2, 50), (1, 1)], 100)
        assert n == len(want) and sorted(matches) == [(1, 7), (2, 50 * n // 100)]
        assert fallbacks(metrics, "stream_down") == 1
        # a's blocks are dropped when its stream drops (no stale claims)
        sink.set_stream_up("a:1", False)
        assert m.match(info, None, 0) == ([], len(want))
        assert m.debug_view()["endpoints"]["a:1"]["blocks"] == []
    finally:
        await m.close()


async def test_lora_completion_ids_and_unknown_model() -> None:
    m, metrics = make()
    m.set_endpoints({"a:1": (1, NOWHERE)})
    sink = m.subscribers.sink
    try:
        sink.set_stream_up("a:1", True)
        ids = list(range(1000, 1100))
        sink.stored("a:1", BlockHasher(16, "sha256_cbor", "0").hashes(ids, lora_name="ad"))
        comp = RequestInfo("r", "/v1/completions", {"prompt": ids}, "demo", "ad", "ad")
        assert m.match(comp, None, 0) == ([(1, 6)], 6)
        base = RequestInfo("r", "/v1/completions", {"prompt": ids}, "demo", "", "demo")
        assert m.match(base, None, 0) == ([], 6)  # the adapter is part of the hash
        assert m.match(chat("hi", model="other"), None, 0) is None  # no tokenizer for it
        assert metrics.registry.get_sample_value("kthena_router_kvcache_aware_fallback_total",
                                                 {"model": "other", "reason": "no_tokenizer"}) == 1
        bad = RequestInfo("r", "/v1/completions", {"prompt": [-1, 2]}, "demo", "", "demo")
        assert m.match(bad, None, 0) is None
        assert fallbacks(metrics, "tokenize_error") == 1
    finally:
        await m.close()


def test_event_source_from_labels_or_defaults() -> None:
    args = KvCacheAwareArgs()
    assert event_source("10.0.0.5", {}, args) == EventSource("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")
    labels = {"kthena.io/kv-events-port": "7000", "kthena.io/kv-events-replay-port": "none"}
    assert event_source("::1", labels, args) == EventSource("tcp://[::1]:7000", None)
    assert event_source("10.0.0.5", {"kthena.io/kv-events-port": "x"}, args) is None


async def test_long_prompts_are_tokenized_ahead_off_the_loop_with_the_same_result() -> None:
    from kthena_router.scheduling.kv_matcher import OFFLOAD_CHARS

    m, _ = make()
    m.set_endpoints({"a:1": (1, NOWHERE)})
    sink = m.subscribers.sink
    try:
        long_info = chat("shared system prompt words " * (OFFLOAD_CHARS // 20))
        short = chat("short prompt")
        await m.prepare(long_info)
        await m.prepare(short)
        assert long_info.tokens_ready and long_info.tokens is not None
        assert not short.tokens_ready  # cheaper inline than a thread hop
        # No await from here on: the (never connecting) subscriber must not reset the table.
        want = engine_hashes(long_info)
        sink.set_stream_up("a:1", True)
        sink.stored("a:1", want[:9])
        inline = m.match(chat(long_info.obj["messages"][0]["content"]), None, 0)
        assert m.match(long_info, None, 0) == inline == ([(1, 9)], len(want))
    finally:
        await m.close()
