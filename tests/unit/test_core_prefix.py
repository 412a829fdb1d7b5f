"""kthena_router._core prefix hashing and PrefixIndex, against a Python reference model."""

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router._core import BlockHashes, PrefixIndex, prefix_hashes, prefix_seed

SEED = prefix_seed(b"demo", b"")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=200), st.integers(1, 9), st.integers(0, 40))
def test_chain_hashes_identify_prefixes(a, b, bs, max_blocks):
    ha, hb = prefix_hashes(a, bs, SEED, max_blocks).tolist(), prefix_hashes(b, bs, SEED, max_blocks).tolist()
    assert len(ha) == min(len(a) // bs, max_blocks)  # trailing partial block not hashed
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    same_blocks = min(common // bs, len(ha), len(hb))
    assert ha[:same_blocks] == hb[:same_blocks]
    # From the first differing block on, every hash differs (the chain carries the prefix).
    assert all(x != y for x, y in zip(ha[same_blocks:], hb[same_blocks:]))


def test_seed_separates_model_and_adapter():
    p = b"a" * 64
    seeds = {prefix_seed(b"m", b""), prefix_seed(b"m", b"lora1"), prefix_seed(b"n", b""), prefix_seed(b"m", b"lora2")}
    assert len(seeds) == 4
    assert len({prefix_hashes(p, 16, s, 4).tolist()[0] for s in seeds}) == 4


def test_block_size_zero_rejected():
    with pytest.raises(ValueError):
        prefix_hashes(b"abc", 0, SEED, 4)
    with pytest.raises(ValueError):
        PrefixIndex(10).match_prompt(b"abc", 0, SEED, 4)


def test_match_prompt_hashes_then_matches():
    ix = PrefixIndex(1000)
    prompt = bytes(range(256)) * 8  # 2 KiB = 32 blocks of 64
    hashes, matches = ix.match_prompt(prompt, 64, SEED, 128)
    assert len(hashes) == 32 and matches == []
    ix.insert(7, hashes)
    ix.insert(9, BlockHashes(hashes.tolist()[:10]))
    longer = prompt[:64 * 20] + b"different tail" * 100
    _, matches = ix.match_prompt(longer, 64, SEED, 128)
    assert sorted(matches) == [(7, 20), (9, 10)]
    # Another model's seed matches nothing.
    assert ix.match_prompt(prompt, 64, prefix_seed(b"other", b""), 128)[1] == []
    # Long prompt: GIL-released path, same hashes as the short path for the common blocks.
    big = prompt * 64
    h_big, m_big = ix.match_prompt(big, 64, SEED, 10_000)
    assert h_big.tolist()[:32] == hashes.tolist() and sorted(m_big) == [(7, 32), (9, 10)]


def test_remove_endpoint_and_accounting():
    ix = PrefixIndex(100)
    ix.insert(1, BlockHashes([1, 2, 3]))
    ix.insert(2, BlockHashes([1, 2]))
    assert len(ix) == 5 and ix.endpoints() == [1, 2] and ix.endpoint_len(1) == 3
    assert ix.memory_bytes() > 0
    assert ix.remove_endpoint(1) == 3
    assert ix.endpoints() == [2] and len(ix) == 2
    assert ix.match_hashes(BlockHashes([1, 2, 3])) == [(2, 2)]


class Reference:
    """endpoint -> OrderedDict of hashes, most recently used last."""

    def __init__(self, cap: int):
        self.cap: dict[int, int] = {}
        self.default = cap
        self.held: dict[int, OrderedDict[int, None]] = {}

    def insert(self, ep, hashes):
        od = self.held.setdefault(ep, OrderedDict())
        cap = self.cap.get(ep, self.default)
        for h in reversed(hashes):  # chain head ends most recently used
            if h in od:
                od.move_to_end(h)
                continue
            if cap == 0:
                continue
            if len(od) >= cap:
                od.popitem(last=False)
            od[h] = None

    def match(self, hashes):
        out = {}
        for ep, od in self.held.items():
            k = 0
            while k < len(hashes) and hashes[k] in od:
                k += 1
            if k:
                out[ep] = k
        return out

    def evict(self, ep, hashes):
        od = self.held.get(ep, {})
        return sum(od.pop(h, 0) is None for h in set(hashes) if h in od)

    def set_capacity(self, ep, cap):
        self.cap[ep] = cap
        od = self.held.setdefault(ep, OrderedDict())
        while len(od) > cap:
            od.popitem(last=False)


small_hashes = st.lists(st.integers(0, 15), max_size=8)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 4), small_hashes),
        st.tuples(st.just("insert"), st.integers(0, 4), small_hashes),
        st.tuples(st.just("match"), st.just(0), small_hashes),
        st.tuples(st.just("evict"), st.integers(0, 4), small_hashes),
        st.tuples(st.just("remove"), st.integers(0, 4), st.just([])),
        st.tuples(st.just("cap"), st.integers(0, 4), st.integers(0, 6)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6), ops)
def test_index_agrees_with_reference_model(default_cap, program):
    ix, ref = PrefixIndex(default_cap), Reference(default_cap)
    for op, ep, arg in program:
        if op == "insert":
            ix.insert(ep, BlockHashes(arg))
            ref.insert(ep, arg)
        elif op == "match":
            assert dict(ix.match_hashes(BlockHashes(arg))) == ref.match(arg)
        elif op == "evict":
            assert ix.evict(ep, BlockHashes(arg)) == ref.evict(ep, arg)
        elif op == "remove":
            assert ix.remove_endpoint(ep) == len(ref.held.pop(ep, {}))
            ref.cap.pop(ep, None)
        else:
            ix.set_capacity(ep, arg)
            ref.set_capacity(ep, arg)
        assert len(ix) == sum(len(od) for od in ref.held.values())
    for ep, od in ref.held.items():
        assert ix.endpoint_len(ep) == len(od)
