"""kthena_router._core KvOwnership and token block hashing, against a Python reference model."""

import hashlib
import struct
from array import array
from collections import Counter

import cbor2

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router._core import KvOwnership, block_hash_key, token_block_hashes
from kthena_router.kv_events.hashing import BlockHasher

MASK64 = (1 << 64) - 1
STORED, REMOVED, CLEARED = 1, 2, 3


def flat(events) -> bytes:
    """Encode [(tag, hashes)] in the flat batch format."""
    words = []
    for tag, hashes in events:
        words += [tag, len(hashes), *hashes]
    return struct.pack(f"<{len(words)}Q", *words)


def _cbor2_chain(tokens, bs, seed, lora):
    """vLLM's recipe spelled with cbor2 itself (the oracle vLLM uses)."""
    fn = lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()  # noqa: E731
    parent, out = fn(seed), []
    for i in range(len(tokens) // bs):
        parent = fn((parent, tuple(tokens[i * bs:(i + 1) * bs]), None if lora is None else (lora,)))
        out.append(int.from_bytes(parent[-8:], "big"))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(1, 20),
       st.one_of(st.none(), st.text(max_size=30)), st.sampled_from(["0", "42", "", "seed-\u00e9"]))
def test_vllm_sha256_cbor_matches_the_python_reference(tokens, bs, lora, seed):
    want = BlockHasher(bs, "sha256_cbor", seed).hashes(tokens, lora_name=lora)
    got = token_block_hashes(tokens, bs, 0, 1000, "vllm-sha256-cbor", lora=lora, hash_seed=seed)
    assert got == want
    assert token_block_hashes(array("I", tokens), bs, 0, 1000, "vllm-sha256-cbor", lora=lora,
                              hash_seed=seed) == want


def test_vllm_sha256_cbor_matches_cbor2():
    toks = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1] * 8  # every CBOR head width
    assert token_block_hashes(toks, 16, 0, 100, "vllm-sha256-cbor") == _cbor2_chain(toks, 16, "0", None)
    assert token_block_hashes(toks, 8, 0, 3, "vllm-sha256-cbor", lora="ad-\u00e9" * 20,
                              hash_seed="7") == _cbor2_chain(toks, 8, "7", "ad-\u00e9" * 20)[:3]


def test_simulator_private_scheme_is_not_offered():
    with pytest.raises(ValueError):
        token_block_hashes([1, 2], 1, 0, 4, "cpython-tuple")


def test_xxh3_scheme_chains_and_limits():
    toks = list(range(40))
    h = token_block_hashes(toks, 8, 1, 100)
    assert len(h) == 5 and len(token_block_hashes(toks, 8, 1, 2)) == 2
    other = toks[:16] + [7] * 24
    assert token_block_hashes(other, 8, 1, 100)[:2] == h[:2]
    assert all(a != b for a, b in zip(token_block_hashes(other, 8, 1, 100)[2:], h[2:]))
    with pytest.raises(ValueError):
        token_block_hashes(toks, 0, 1, 4)
    with pytest.raises(ValueError):
        token_block_hashes(toks, 8, 1, 4, "sha256")
    with pytest.raises(ValueError):
        token_block_hashes(b"abc", 8, 1, 4)  # not a u32 array


def test_block_hash_key_matches_vllm_int_form():
    digest = bytes(range(32))
    assert block_hash_key(digest) == int.from_bytes(digest, "big") & MASK64
    assert block_hash_key(b"\x01\x02") == 0x0102


def test_events_match_and_stream_down():
    t = KvOwnership(1000)
    assert t.apply(1, flat([(STORED, [10, 11, 12]), (STORED, [13])])) == 2
    t.stored(2, [10, 11])
    assert dict(t.match_hashes([10, 11, 12, 13, 99])) == {1: 4, 2: 2}
    t.apply(1, flat([(REMOVED, [12])]))
    assert dict(t.match_hashes([10, 11, 12])) == {1: 2, 2: 2}
    t.set_stream_down(2, True, clear=False)
    assert t.down_endpoints() == [2] and t.is_stream_down(2)
    assert dict(t.match_hashes([10, 11])) == {1: 2}  # caller falls back for endpoint 2
    t.set_stream_down(2, False)
    assert dict(t.match_hashes([10, 11])) == {1: 2, 2: 2}
    t.set_stream_down(2, True)  # clears by default
    assert t.endpoint_len(2) == 0
    assert t.apply(1, flat([(CLEARED, [])])) == 1 and t.endpoint_len(1) == 0
    assert t.endpoints() == [1, 2]
    assert t.remove_endpoint(2) == 0 and t.endpoints() == [1]


def test_malformed_batch_changes_nothing():
    t = KvOwnership(10)
    t.stored(1, [5])
    for bad in (flat([(STORED, [1])])[:-8], flat([(9, [])]), flat([(CLEARED, [1])]), b"\x00" * 7):
        with pytest.raises(ValueError):
            t.apply(1, flat([(STORED, [6])]) + bad)
    assert t.endpoint_hashes(1) == [5]


def test_match_tokens_uses_the_table_scheme():
    t = KvOwnership(1000, hash_scheme="vllm-sha256-cbor", hash_seed="3")
    toks = list(range(64))
    t.stored(3, BlockHasher(16, "sha256_cbor", "3").hashes(toks[:48]))
    assert t.match_tokens(toks, 16, max_blocks=100) == (4, [(3, 3)])
    assert t.match_tokens(array("I", toks), 16, max_blocks=2) == (2, [(3, 2)])
    assert t.match_tokens(toks, 16, lora="ad") == (4, [])  # an adapter's blocks differ
    t.stored(4, BlockHasher(16, "sha256_cbor", "3").hashes(toks, lora_name="ad"))
    assert t.match_tokens(toks, 16, lora="ad") == (4, [(4, 4)])
    big = list(range(100, 20_100))  # above the GIL-release threshold
    t.stored(5, BlockHasher(16, "sha256_cbor", "3").hashes(big[:160]))
    assert t.match_tokens(big, 16) == (1250, [(5, 10)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1_000), st.lists(st.integers(0, 2**32 - 1), max_size=70),
                          st.sampled_from([1, 4, 16]), st.sampled_from([None, "ad", "ad2"])),
                min_size=1, max_size=25),
       st.sampled_from([0, 8, 1 << 12]))
def test_digest_memo_equals_fresh_hashing(steps, memo_blocks):
    """Prompts that share prefixes with earlier ones in random ways (cut an earlier prompt,
    append tokens; random block size and LoRA): match_tokens with the digest memo gives
    exactly vLLM's hashes (cbor2 oracle), as without it; repeated blocks come from the memo."""
    t = KvOwnership(1 << 16, hash_scheme="vllm-sha256-cbor", hash_seed="5", hash_memo_blocks=memo_blocks)
    prompts: list[list[int]] = [[]]
    for cut, extra, bs, lora in steps:
        base = prompts[cut % len(prompts)]
        toks = base[:cut % (len(base) + 1)] + extra
        want = _cbor2_chain(toks, bs, "5", lora)
        if cut % 7 == 0:
            t.clear_hash_memo()
        t.stored(1, want)
        assert t.match_tokens(array("I", toks), bs, lora=lora) == (len(want), [(1, len(want))] if want else [])
        t.all_cleared(1)
        prompts.append(toks)
    entries, capacity, hits, misses = t.hash_memo_stats()
    assert capacity == memo_blocks // 2 * 2 and entries <= capacity
    if memo_blocks == 0:
        assert hits == 0


def test_digest_memo_serves_a_shared_prefix():
    t = KvOwnership(1000, hash_scheme="vllm-sha256-cbor", hash_seed="3", hash_memo_blocks=1000)
    shared = list(range(1000, 1320))  # 20 blocks
    assert t.match_tokens(shared + [1] * 16, 16) == (21, [])
    assert t.hash_memo_stats() == (21, 1000, 0, 21)
    toks = shared + [2] * 40
    t.stored(9, BlockHasher(16, "sha256_cbor", "3").hashes(toks))
    assert t.match_tokens(toks, 16) == (22, [(9, 22)])
    assert t.hash_memo_stats()[2:] == (20, 23)  # the 20 shared blocks were not hashed again
    assert t.match_tokens(toks, 16, lora="ad") == (22, [])  # another adapter: other digests
    assert t.hash_memo_stats()[2:] == (20, 45)
    t.clear_hash_memo()
    assert t.hash_memo_stats()[0] == 0 and t.match_tokens(toks, 16) == (22, [(9, 22)])


def test_large_batch_without_gil_and_capacity():
    t = KvOwnership(5000)
    hashes = list(range(1, 20_001))
    t.apply(7, flat([(STORED, hashes)]))  # 160 KiB batch: GIL released
    assert len(t) == 5000 and t.overflow_drops == 15_000
    # Chain heads are kept, tails dropped.
    assert dict(t.match_hashes(hashes[:6000])) == {7: 5000}
    assert t.memory_bytes() > 0


class Reference:
    """endpoint -> Counter of hashes (copies), and the set of down endpoints."""

    def __init__(self):
        self.held: dict[int, Counter] = {}
        self.down: set[int] = set()

    def stored(self, ep, hashes):
        self.held.setdefault(ep, Counter()).update(hashes)

    def removed(self, ep, hashes):
        c = self.held.get(ep)
        for h in hashes:
            if c is not None and c[h] > 0:
                c[h] -= 1
                if c[h] == 0:
                    del c[h]

    def match(self, hashes):
        out = {}
        for ep, c in self.held.items():
            if ep in self.down:
                continue
            k = 0
            while k < len(hashes) and hashes[k] in c:
                k += 1
            if k:
                out[ep] = k
        return out


small = st.lists(st.integers(0, 12), max_size=8)
program = st.lists(
    st.one_of(
        st.tuples(st.just("stored"), st.integers(0, 3), small),
        st.tuples(st.just("stored"), st.integers(0, 3), small),
        st.tuples(st.just("removed"), st.integers(0, 3), small),
        st.tuples(st.just("batch"), st.integers(0, 3), st.lists(st.tuples(st.sampled_from([1, 2, 3]), small), max_size=4)),
        st.tuples(st.just("match"), st.just(0), small),
        st.tuples(st.just("cleared"), st.integers(0, 3), st.just([])),
        st.tuples(st.just("remove"), st.integers(0, 3), st.just([])),
        st.tuples(st.just("down"), st.integers(0, 3), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(program)
def test_table_agrees_with_reference_model(prog):
    t, ref = KvOwnership(1 << 20), Reference()
    for op, ep, arg in prog:
        if op == "stored":
            t.stored(ep, arg)
            ref.stored(ep, arg)
        elif op == "removed":
            t.removed(ep, arg)
            ref.removed(ep, arg)
        elif op == "batch":
            events = [(tag, [] if tag == CLEARED else hs) for tag, hs in arg]
            assert t.apply(ep, flat(events)) == len(events)
            for tag, hs in events:
                if tag == STORED:
                    ref.stored(ep, hs)
                elif tag == REMOVED:
                    ref.removed(ep, hs)
                elif ep in ref.held:
                    ref.held[ep].clear()
        elif op == "match":
            assert dict(t.match_hashes(arg)) == ref.match(arg)
        elif op == "cleared":
            assert t.all_cleared(ep) == len(ref.held.get(ep, ()))
            if ep in ref.held:
                ref.held[ep].clear()
        elif op == "remove":
            assert t.remove_endpoint(ep) == len(ref.held.pop(ep, ()))
            ref.down.discard(ep)
        else:
            t.set_stream_down(ep, arg, clear=False)
            ref.held.setdefault(ep, Counter())
            (ref.down.add if arg else ref.down.discard)(ep)
        assert len(t) == sum(len(c) for c in ref.held.values())
    for ep, c in ref.held.items():
        assert t.endpoint_len(ep) == len(c)
        assert all(t.refs(ep, h) == n for h, n in c.items())
    assert t.down_endpoints() == sorted(ref.down)
