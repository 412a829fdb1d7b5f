"""The pod-state hub's frames (kthena_router/podstate/wire.py): encode/decode round trips
and refusal of corrupt input."""

from __future__ import annotations

import pytest

from kthena_router._core import BlockHashes
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.podstate import wire


def _chain(hashes: list[int]) -> bytes:
    return BlockHashes(hashes).to_bytes()


def test_insert_records_round_trip_in_order() -> None:
    big = [0, 1, 2**63, 2**64 - 1]
    payload = wire.encode_insert("10.0.0.1:8000", _chain(big)) + wire.encode_insert("[::1]:9", b"") + \
        wire.encode_insert("é:1", _chain(list(range(1000))))
    decoded = [(k, BlockHashes.from_bytes(c).tolist()) for k, c in wire.decode_inserts(payload)]
    assert decoded == [("10.0.0.1:8000", big), ("[::1]:9", []), ("é:1", list(range(1000)))]
    # compact: 2 + key + 4 + 8 per hash, the hashes little-endian u64 (the format is unchanged)
    rec = wire.encode_insert("a:1", _chain([5, 2**64 - 2]))
    assert rec == b"\x03\x00a:1\x02\x00\x00\x00" + bytes([5, 0, 0, 0, 0, 0, 0, 0]) + b"\xfe" + b"\xff" * 7


def test_insert_hashes_must_be_whole_words() -> None:
    with pytest.raises(ValueError):
        wire.encode_insert("a:1", b"\x00" * 9)
    with pytest.raises(ValueError):
        BlockHashes.from_bytes(b"\x00" * 9)


@pytest.mark.parametrize("cut", [1, 2, 5, 9, 20])
def test_truncated_insert_record_is_refused(cut: int) -> None:
    payload = wire.encode_insert("a:1", _chain([1, 2]))
    with pytest.raises(wire.FrameError):
        list(wire.decode_inserts(payload[:-cut]))


def test_frame_header() -> None:
    f = wire.frame(wire.INSERTS, b"xyz")
    assert wire.parse_header(f[:wire.HEADER.size]) == (3, wire.INSERTS)
    assert f[wire.HEADER.size:] == b"xyz"
    for bad in (wire.HEADER.pack(0, 1), wire.HEADER.pack(wire.MAX_FRAME + 1, 1)):
        with pytest.raises(wire.FrameError):
            wire.parse_header(bad)


def test_snapshot_round_trip() -> None:
    s = EndpointSnapshot("127.0.0.1:8000", "vllm", 12.5, 13.0, False, 0, None, last_running=3, last_waiting=1,
                         last_kv_usage=0.25, last_loaded_loras=("sql",), num_gpu_blocks=1024, block_size=16,
                         dp_ranks=2, observed_mark=(4, 2))
    assert wire.decode_snapshot(wire.encode_snapshot(s)) == s
    stale = EndpointSnapshot("a:1", "sglang", None, 1.0, True, 3, "timeout after 1s")
    assert wire.decode_snapshot(wire.encode_snapshot(stale)) == stale


def test_targets_and_probes_round_trip() -> None:
    t = wire.Targets(probe=(wire.ProbeTarget("a:1", "http://a:1", (("Authorization", "x"),), wire.SSL_NONE),
                            wire.ProbeTarget("b:2", "https://b:2", (), wire.SSL_INSECURE)),
                     scrape=(wire.ScrapeSpec("a:1", "http://a:1", "vllm"),))
    assert wire.decode_targets(wire.encode_targets(t)) == t
    assert wire.decode_probes(wire.encode_probes([("a:1", True), ("b:2", False)])) == [("a:1", True), ("b:2", False)]
    assert wire.decode_hello(wire.encode_hello(42)) == {"pid": 42}


def test_garbage_payloads_raise_decode_errors() -> None:
    errors = wire.decode_error()
    for decode in (wire.decode_snapshot, wire.decode_targets, wire.decode_probes):
        with pytest.raises(errors):
            decode(b"\xc1garbage")
