"""prefix-cache's evictedHintSlots (ours): a prefix the router's index dropped for capacity
keeps its last owner as a decaying hint, so the prefix's next request still prefers the
engine that served it (which probably still caches it) over a cold one."""

from __future__ import annotations

import pytest

from kthena_router._core import BlockHashes, PrefixIndex
from kthena_router.config.errors import ConfigError
from kthena_router.scheduling.request import RequestInfo
from kthena_router.scheduling.scheduler import Scheduler

from tests.unit.test_scheduling_scheduler import KEY, endpoints, fresh, sched


def config(hint_slots: int | None, cache: int = 100) -> str:
    """None: evictedHintSlots left at its default."""
    args = f"{{maxHashCacheSize: {cache}" + ("" if hint_slots is None else f", evictedHintSlots: {hint_slots}") + "}"
    return ("scheduler:\n  pluginConfig:\n  - name: prefix-cache\n    args: " + args + "\n"
            "  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 1}\n"
            "      - {name: least-request, weight: 1}\n")


def req(rid: str, tag: str) -> RequestInfo:
    # ~60 blocks of 64 bytes: three such prompts overflow a 100-entry index
    return RequestInfo(rid, "/v1/completions", {"prompt": f"{tag} " + "x" * 3900}, "demo", "", "demo")


def dispatch(s: Scheduler, ep, info: RequestInfo) -> None:
    s.candidates(KEY, s._views[KEY].eps, info)
    s.dispatched(ep, info)
    s.finished(ep)


def test_evicted_prefix_still_prefers_its_last_owner():
    eps = endpoints(3)
    seen = {}
    for slots in (0, 4096):
        s, _ = sched(config(slots))
        assert s.index.hint_slots == slots
        fresh(s, eps)
        # eps[1] serves prefix A, then B and C push A out of its 100-entry index
        for i, tag in enumerate("ABC"):
            dispatch(s, eps[1], req(f"seed{i}", tag))
        ep1 = s._ids[eps[1].key]
        matches, total = s.approx_match(req("probe", "A"))
        assert total >= 60
        seen[slots] = dict(matches or [])
        if slots == 0:
            assert ep1 not in seen[slots], f"A should be evicted from the plain index: {seen}"
            continue
        # a discounted match: some blocks, fewer than the whole prompt
        assert 0 < seen[slots].get(ep1, 0) < total, f"hinted match for eps[1]: {seen}"
        # and the scheduler ranks eps[1] first for A's next request, however its id hashes
        for k in range(8):
            ranked = s.candidates(KEY, eps, req(f"again{k}", "A"))
            assert ranked[0] is eps[1], (k, [e.key for e in ranked], seen)


def test_engine_reported_eviction_and_removed_endpoint_void_hints():
    ix = PrefixIndex(2, hint_slots=64)
    assert ix.hint_slots == 64

    chain = BlockHashes([11, 12, 13, 14])
    ix.insert(7, chain)  # keeps 11, 12; hints for 13, 14
    ix.insert(7, BlockHashes([21, 22]))  # 11, 12 become hints too
    assert dict(ix.match_hashes(chain)).get(7, 0) >= 1
    ix.evict(7, BlockHashes([11, 12, 13, 14]))  # the engine dropped the chain: its hints are void
    assert dict(ix.match_hashes(chain)).get(7, 0) == 0
    ix.insert(8, BlockHashes([31]))
    ix.insert(8, BlockHashes([32, 33]))  # 31 becomes endpoint 8's hint
    assert dict(ix.match_hashes(BlockHashes([31]))).get(8, 0) == 1
    ix.remove_endpoint(8)
    assert ix.match_hashes(BlockHashes([31])) == []
    # the default index has no hint table
    assert PrefixIndex(10).hint_slots == 0


def test_hints_are_on_by_default_at_one_mebibyte():
    s, _ = sched(config(None))
    assert s.prefix_args.evicted_hint_slots == 65536
    assert s.index.hint_slots == 65536
    assert s.index.memory_bytes() >= 65536 * 16


@pytest.mark.parametrize("bad", ["-1", "1.5", "true", "16777217"])
def test_evicted_hint_slots_is_validated(bad: str):
    text = config(None).replace("maxHashCacheSize: 100", f"maxHashCacheSize: 100, evictedHintSlots: {bad}")
    with pytest.raises((ConfigError, ValueError)) as e:
        sched(text)
    assert "evictedHintSlots" in str(e.value)
