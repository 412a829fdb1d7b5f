"""Session keys (first non-empty source) and the shared pin table."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from kthena_router.config.model import SessionKeySource as S
from kthena_router.session import prefer_first
from kthena_router.session.keys import session_key
from kthena_router.session.shared_table import SharedTable


def _key(sources, headers=None, raw=(), query=b"", claims=None) -> str:
    return session_key(sources, headers or {}, list(raw), query, claims or {})


def test_first_non_empty_source_wins_in_list_order() -> None:
    srcs = [S("Header", "x-session"), S("Query", "session"), S("Cookie", "sid"), S("JWTClaim", "sub")]
    everything = dict(headers={"x-session": "h"}, raw=[(b"cookie", b"a=1; sid=c")], query=b"session=q",
                      claims={"sub": "j"})
    assert _key(srcs, **everything) == "h"
    assert _key(srcs, **{**everything, "headers": {"x-session": "  "}}) == "q"
    assert _key(srcs, **{**everything, "headers": {}, "query": b"other=1"}) == "c"
    assert _key(srcs, claims={"sub": "j"}) == "j"
    assert _key(srcs) == ""
    assert _key(list(reversed(srcs)), **everything) == "j"


def test_cookie_and_query_details() -> None:
    c = [S("Cookie", "SID")]
    assert _key(c, raw=[(b"Cookie", b"sid=lower; SID=\"quoted\"")]) == "quoted"  # names are exact
    assert _key(c, raw=[(b"cookie", b"a=1"), (b"cookie", b"SID=second-header")]) == "second-header"
    assert _key(c, raw=[(b"cookie", b"SID=")]) == ""
    q = [S("Query", "s")]
    assert _key(q, query=b"s=a%20b&s=ignored") == "a b"
    assert _key(q, query=b"S=x") == ""


def test_non_string_claims_make_keys() -> None:
    assert _key([S("JWTClaim", "uid")], claims={"uid": 42}) == "42"
    assert _key([S("JWTClaim", "org")], claims={"org": {"id": 1}}) == '{"id":1}'
    assert _key([S("JWTClaim", "uid")], claims={"uid": None}) == ""


def test_prefer_first_only_reorders_candidates() -> None:
    a, b, c = object(), object(), object()
    assert prefer_first([a, b, c], c) == [c, a, b]
    assert prefer_first([a, b], c) == [a, b]  # not a candidate (ejected, filtered): normal order
    assert prefer_first([], c) == []


def test_table_pins_refreshes_expires_and_evicts() -> None:
    t = SharedTable(16)
    t.put(101, 7, now_ms=1000, ttl_ms=500)
    assert t.get(101, now_ms=1400, ttl_ms=500) == 7  # read refreshes: expires at 1900 now
    assert t.get(101, now_ms=1800, ttl_ms=500) == 7
    assert t.get(101, now_ms=2400, ttl_ms=500) is None  # 500 ms after the last read
    assert t.get(101, now_ms=1000, ttl_ms=100) is None  # further away than the ttl: not trusted
    t.put(101, 8, now_ms=3000, ttl_ms=500)
    assert t.get(101, now_ms=3001, ttl_ms=500) == 8
    # one bucket (16 slots / 8 = 2 buckets): keys of the same bucket evict the earliest expiry
    keys = [2 * i + 1 for i in range(9)]  # all odd -> bucket 1
    for n, k in enumerate(keys):
        t.put(k, 100 + n, now_ms=10_000 + n, ttl_ms=1000)
    assert t.get(keys[0], 10_010, 1000) is None  # the oldest went
    assert [t.get(k, 10_010, 1000) for k in keys[1:]] == [100 + n for n in range(1, 9)]
    assert t.count(10_010) == 8


def test_torn_slot_reads_as_empty() -> None:
    t = SharedTable(16)
    t.put(5, 9, now_ms=0, ttl_ms=1000)
    base = (5 % t.buckets) * 8 * 32
    t._map[base + 8:base + 16] = (10).to_bytes(8, "little")  # endpoint word of another writer
    assert t.get(5, 1, 1000) is None


def _writer(path: str) -> None:
    SharedTable(64, path).put(77, 3, now_ms=1_000, ttl_ms=10_000)


def test_table_file_is_shared_between_processes(tmp_path: Path) -> None:
    path = tmp_path / "t.tbl"
    reader = SharedTable(64, path)
    p = multiprocessing.get_context("spawn").Process(target=_writer, args=(str(path),))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert reader.get(77, 2_000, 10_000) == 3
    assert os.stat(path).st_size == reader.size
