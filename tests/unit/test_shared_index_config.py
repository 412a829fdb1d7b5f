"""sharedPrefixIndex: parsing (errors name file, document and field) and the wire records."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from kthena_router._core import BlockHashes, prefix_hashes
from kthena_router.config import ConfigError
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.shared_index.config import SharedIndexSettings
from kthena_router.shared_index.sync import SharedIndexMetrics, SharedIndexSync, decode, encode


def test_absent_section_is_none_and_defaults_apply() -> None:
    assert load_router_configuration_bytes(b"scheduler: {}\n").shared_index is None
    rc = load_router_configuration_bytes(b"sharedPrefixIndex: {redis: {address: '127.0.0.1:6379'}}\n")
    assert rc.shared_index == SharedIndexSettings("127.0.0.1:6379")  # the default pipeline has prefix-cache


def test_every_field_parses() -> None:
    rc = load_router_configuration_bytes(b"""
sharedPrefixIndex:
  redis: {address: "10.0.0.5:6380"}
  key: fleet-a:prefix
  syncInterval: 20ms
  ttl: 2m
  maxEntries: 5000
  maxPending: 300
  redisTimeout: 100ms
  redisRetry: 3s
""")
    assert rc.shared_index == SharedIndexSettings("10.0.0.5:6380", "fleet-a:prefix", 0.02, 120.0, 5000, 300,
                                                  0.1, 3.0)


@pytest.mark.parametrize("section, field, fragment", [
    ("{}", "sharedPrefixIndex.redis", "required"),
    ("{redis: {address: nowhere}}", "sharedPrefixIndex.redis.address", "host:port"),
    ("{redis: {address: 'h:1', url: x}}", "sharedPrefixIndex.redis.url", "unknown field"),
    ("{redis: {address: 'h:1'}, syncInterval: 5}", "sharedPrefixIndex.syncInterval", "duration"),
    ("{redis: {address: 'h:1'}, syncInterval: 2h}", "sharedPrefixIndex.syncInterval", "between"),
    ("{redis: {address: 'h:1'}, ttl: 10ms, syncInterval: 20ms}", "sharedPrefixIndex.ttl", "between"),
    ("{redis: {address: 'h:1'}, ttl: 2s, syncInterval: 5s}", "sharedPrefixIndex.ttl", "longer than"),
    ("{redis: {address: 'h:1'}, maxEntries: 10}", "sharedPrefixIndex.maxEntries", "between 100"),
    ("{redis: {address: 'h:1'}, maxPending: true}", "sharedPrefixIndex.maxPending", "integer"),
    ("{redis: {address: 'h:1'}, ttls: 1m}", "sharedPrefixIndex.ttls", "did you mean 'ttl'"),
    ("[1]", "sharedPrefixIndex", "mapping"),
])
def test_bad_settings_name_file_document_and_field(section: str, field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_router_configuration_bytes(f"sharedPrefixIndex: {section}\n", source="rc.yaml")
    err = ei.value.problems[0]
    assert (err.file, err.document, err.field) == ("rc.yaml", "document 1", field), str(ei.value)
    assert fragment in err.message, str(ei.value)


def test_a_pipeline_without_prefix_matching_is_refused() -> None:
    """Nothing would be hashed, so the section would be silently ignored."""
    with pytest.raises(ConfigError) as ei:
        load_router_configuration_bytes(b"""
scheduler: {plugins: {Score: {enabled: [{name: least-request, weight: 1}]}}}
sharedPrefixIndex: {redis: {address: '127.0.0.1:6379'}}
""", source="rc.yaml")
    assert ei.value.field == "sharedPrefixIndex" and "prefix-cache" in ei.value.message


def test_records_round_trip_and_a_truncated_tail_is_dropped() -> None:
    hashes = prefix_hashes(b"x" * 640, 64, 7, 128)
    assert len(hashes) == 10
    recs = [("127.0.0.1:8001", hashes.to_bytes()), ("10.1.2.3:80", BlockHashes([2**64 - 1, 0, 5]).to_bytes())]
    blob = encode(recs)
    assert decode(blob) == recs
    assert BlockHashes.from_bytes(decode(blob)[0][1]).tolist() == hashes.tolist()
    # u8 key length | key | u32 n | n x u64, little-endian
    assert blob[-(1 + 11 + 4 + 24):-24] == b"\x0b10.1.2.3:80\x03\x00\x00\x00" and blob[-24:-16] == b"\xff" * 8
    assert decode(blob[:-3]) == recs[:1]
    assert decode(b"") == []


def test_a_round_takes_each_chain_once_per_endpoint_as_bytes() -> None:
    sync = SharedIndexSync(SharedIndexSettings("127.0.0.1:1"), lambda: None,  # type: ignore[arg-type,return-value]
                           SharedIndexMetrics(CollectorRegistry()))
    a, b = prefix_hashes(b"a" * 640, 64, 7, 128), prefix_hashes(b"b" * 640, 64, 7, 128)
    for ep, h in (("10.0.0.1:80", a), ("10.0.0.1:80", b), ("10.0.0.1:80", a), ("10.0.0.2:80", a)):
        sync.record(ep, h)
    assert sync._take() == [("10.0.0.1:80", a.to_bytes()), ("10.0.0.1:80", b.to_bytes()),
                            ("10.0.0.2:80", a.to_bytes())]
    assert not sync.pending


class _Target:
    def __init__(self) -> None:
        self.got: list[str] = []

    def insert(self, key: str, hashes: BlockHashes) -> bool:
        self.got.append(key)
        return True


def test_own_pods_entries_are_skipped_only_while_the_hub_relays_them() -> None:
    relays = [True]
    target = _Target()
    metrics = SharedIndexMetrics(CollectorRegistry())
    sync = SharedIndexSync(SharedIndexSettings("127.0.0.1:1"), target, metrics, b"pod-a", lambda: relays[0])
    chain = prefix_hashes(b"a" * 640, 64, 7, 128).to_bytes()
    now = 10_000_000

    def entry(n: int, worker: bytes, pod: bytes | None) -> tuple[bytes, dict[bytes, bytes]]:
        fields = {b"r": worker, b"d": encode([(f"10.0.0.{n}:80", chain)])}
        if pod is not None:
            fields[b"p"] = pod
        return f"{now}-{n}".encode(), fields

    entries = [entry(1, b"sibling", b"pod-a"), entry(2, b"other", b"pod-b"), entry(3, b"old-router", None),
               entry(4, sync.replica, b"pod-a")]
    sync._merge(entries, now)
    assert target.got == ["10.0.0.2:80", "10.0.0.3:80"]  # the sibling's came from the hub; its own never
    assert metrics.same_pod._value.get() == 1
    relays[0] = False  # hub down: the sibling's records reach this worker only through Redis
    target.got.clear()
    sync._merge(entries, now)
    assert target.got == ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    one = SharedIndexSync(SharedIndexSettings("127.0.0.1:1"), target, metrics)  # one worker: no pod id
    target.got.clear()
    one._merge(entries, now)
    assert target.got == ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"]
