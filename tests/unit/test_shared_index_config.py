"""sharedPrefixIndex: parsing (errors name file, document and field) and the wire records."""

from __future__ import annotations

import pytest

from kthena_router._core import prefix_hashes
from kthena_router.config import ConfigError
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.shared_index.config import SharedIndexSettings
from kthena_router.shared_index.sync import decode, encode


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
    chain = prefix_hashes(b"x" * 640, 64, 7, 128).tolist()
    assert len(chain) == 10
    recs = [("127.0.0.1:8001", chain), ("10.1.2.3:80", [2**64 - 1, 0, 5])]
    blob = encode(recs)
    assert decode(blob) == recs
    assert decode(blob[:-3]) == recs[:1]
    assert decode(b"") == []
