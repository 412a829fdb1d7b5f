"""OwnershipTable against a simple reference model (per-endpoint hash multisets)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router.kv_events.ownership import OwnershipTable

EPS = ["a", "b", "c"]
ops = st.lists(st.tuples(
    st.sampled_from(["stored", "removed", "cleared"]),
    st.sampled_from(EPS),
    st.lists(st.integers(0, 7), max_size=5),
), max_size=40)


def ref_match(model: dict[str, Counter], hashes: list[int]) -> dict[str, int]:
    out = {}
    for e in EPS:
        n = 0
        for h in hashes:
            if model[e][h] <= 0:
                break
            n += 1
        out[e] = n
    return out


@settings(max_examples=200, deadline=None)
@given(ops, st.lists(st.integers(0, 7), max_size=6))
def test_matches_reference_model(operations, query):
    t = OwnershipTable()
    model = {e: Counter() for e in EPS}
    for op, ep, hashes in operations:
        if op == "stored":
            t.stored(ep, hashes)
            model[ep].update(hashes)
        elif op == "removed":
            t.removed(ep, hashes)
            for h in hashes:
                if model[ep][h] > 0:
                    model[ep][h] -= 1
        else:
            t.cleared(ep)
            model[ep].clear()
    for e in EPS:
        assert t.blocks(e) == {h for h, n in model[e].items() if n > 0}
    assert t.match(EPS, query) == ref_match(model, query)


def test_prefix_match_and_stream_state():
    t = OwnershipTable()
    t.stored("a", [1, 2, 3])
    t.stored("b", [1, 2])
    t.stored("b", [2])  # a second block with the same hash
    assert t.match(["a", "b", "c"], [1, 2, 3, 4]) == {"a": 3, "b": 2, "c": 0}
    t.removed("b", [2])
    assert t.match(["b"], [1, 2]) == {"b": 2}  # still one block holding hash 2
    t.removed("b", [2])
    assert t.match(["b"], [1, 2]) == {"b": 1}
    assert not t.is_up("a")
    t.set_stream_up("a", True)
    assert t.is_up("a")
    t.remove_endpoint("a")
    assert not t.is_up("a") and t.blocks("a") == frozenset()
    assert t.match(["a", "b"], [1]) == {"a": 0, "b": 1}
