"""The hop bodies of each connector (pure logic; the wire is tested in tests/integration/test_pd_*.py)."""

from __future__ import annotations

import orjson
import pytest

from kthena_router.endpoints.health import EndpointHealth
from kthena_router.endpoints.registry import EndpointState
from kthena_router.pd.connectors import HopBodies, NoKvParams
from kthena_router.proxy.body import parse_body
from kthena_router.proxy.relay_sse import first_event_error

CHAT = "/v1/chat/completions"


def _body(**extra: object) -> object:
    obj = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, **extra}
    return parse_body(orjson.dumps(obj), CHAT)


def _ep(bootstrap: int | None = None) -> EndpointState:
    return EndpointState("10.0.0.7:8000", "10.0.0.7", 8000, "pod-7", "http", None, EndpointHealth(), {}, "s/x",
                         {}, bootstrap)


def test_prefill_hop_is_one_token_not_streamed() -> None:
    b = HopBodies(_body(stream=True, stream_options={"include_usage": False}, max_completion_tokens=50),
                  "http", "engine-model", inject_usage=True)
    p = orjson.loads(b.prefill)
    assert p["stream"] is False and p["stream_options"] is None
    assert p["max_tokens"] == 1 and p["max_completion_tokens"] == 1
    assert p["model"] == "engine-model" and p["temperature"] == 0.5 and "kv_transfer_params" not in p
    d = orjson.loads(b.plain_decode)
    assert d["stream"] is True and d["max_completion_tokens"] == 50 and "max_tokens" not in d
    assert d["stream_options"] == {"include_usage": True} and d["model"] == "engine-model"


def test_prefill_hop_adds_only_what_it_needs() -> None:
    b = HopBodies(_body(), "lmcache", None, inject_usage=False)
    p = orjson.loads(b.prefill)
    assert set(p) == {"model", "messages", "temperature", "max_tokens"}
    assert b.plain_decode == b.body.raw  # nothing changes: the client's bytes


@pytest.mark.parametrize("connector", ["nixl", "mooncake"])
def test_vllm_kv_params_relay(connector: str) -> None:
    b = HopBodies(_body(stream=True), connector, None, inject_usage=True)
    assert orjson.loads(b.prefill)["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    kv = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "10.0.0.1", "remote_port": 5600,
          "remote_engine_id": "e", "remote_request_id": "r", "tp_size": 1}
    d = orjson.loads(b.decode_with_kv(orjson.dumps({"id": "x", "kv_transfer_params": kv})))
    assert d["kv_transfer_params"] == kv and d["stream"] is True and d["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("reply", [b'{"kv_transfer_params": null}', b"{}", b"not json", b'{"kv_transfer_params": {}}'])
def test_reply_without_kv_params_refuses_the_decode(reply: bytes) -> None:
    with pytest.raises(NoKvParams):
        HopBodies(_body(), "nixl", None, inject_usage=False).decode_with_kv(reply)


def test_bootstrap_fields_on_both_hops_new_room_per_pair() -> None:
    b = HopBodies(_body(stream=True), "bootstrap", None, inject_usage=False)
    p1, d1, room1 = b.bootstrap(_ep(9100))
    p2, _d2, room2 = b.bootstrap(_ep())
    p, d = orjson.loads(p1), orjson.loads(d1)
    for hop in (p, d):
        assert (hop["bootstrap_host"], hop["bootstrap_port"], hop["bootstrap_room"]) == ("10.0.0.7", 9100, room1)
    assert p["max_tokens"] == 1 and p["stream"] is False and d["stream"] is True
    assert 0 <= room1 < 2 ** 63 and room1 != room2
    assert orjson.loads(p2)["bootstrap_port"] == 8998  # SGLang's default


@pytest.mark.parametrize("events,expected", [
    (b'data: {"error": {"message": "Internal server error", "code": 500}}\n\ndata: [DONE]\n\n',
     "Internal server error"),
    (b'data: {"id": "c", "choices": [{"delta": {"content": "error"}}]}\n\n', None),
    (b'data: {"id": "c", "choices": [], "error": "x"}\n\n', None),
    (b": keep-alive\n\n", None),
])
def test_first_event_error(events: bytes, expected: str | None) -> None:
    assert first_event_error(events) == expected
