"""vLLM block hashes: the simulator's and the router's implementations (written apart)
agree with each other and with vLLM's own recipe (cbor2 canonical / pickle + sha256)."""

from __future__ import annotations

import hashlib
import pickle

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router.kv_events.hashing import BlockHasher, fold_hash
from loadtest.simulator.kv_events import VllmBlockHasher, external_hash

MASK64 = (1 << 64) - 1


def vllm_recipe(tokens: list[int], bs: int, seed: str, lora: str | None, algo: str) -> list[int]:
    """vLLM's hash_block_tokens chain spelled out with the libraries vLLM itself uses."""
    if algo == "sha256_cbor":
        fn = lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()  # noqa: E731
    else:
        fn = lambda x: hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()  # noqa: E731
    none_hash = fn(seed)
    extra = (lora,) if lora is not None else None
    out, parent = [], None
    for i in range(len(tokens) // bs):
        parent = fn((parent or none_hash, tuple(tokens[i * bs:(i + 1) * bs]), extra))
        out.append(int.from_bytes(parent, "big") & MASK64)
    return out


def sim_hashes(tokens: list[int], bs: int, seed: str, lora: str | None, algo: str) -> list[int]:
    return [external_hash(d) for d in VllmBlockHasher(algo, seed).chain(tokens, bs, lora)]  # type: ignore[arg-type]


def test_none_hash_is_the_seed_string_hashed():
    # cbor2.dumps("0") == b"\x61\x30": a text string of length 1
    assert BlockHasher(hash_seed="0").none_hash == hashlib.sha256(b"\x61\x30").digest()
    assert VllmBlockHasher("sha256_cbor", "0").none_hash == hashlib.sha256(b"\x61\x30").digest()


def test_known_vector():
    toks = list(range(1, 33))
    want = vllm_recipe(toks, 16, "0", None, "sha256_cbor")
    assert len(want) == 2
    assert BlockHasher(16, "sha256_cbor", "0").hashes(toks) == want
    assert sim_hashes(toks, 16, "0", None, "sha256_cbor") == want
    # the seed, the LoRA name and the parent all change the hash
    assert BlockHasher(16, hash_seed="1").hashes(toks)[0] != want[0]
    assert BlockHasher(16).hashes(toks, lora_name="a")[0] != want[0]
    assert BlockHasher(16).hashes(toks[16:] + toks[:16])[1] != want[1]


@pytest.mark.parametrize("algo", ["sha256_cbor", "sha256"])
@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**40), max_size=70),
    bs=st.integers(1, 16),
    seed=st.sampled_from(["0", "42", "é"]),
    lora=st.one_of(st.none(), st.text(min_size=1, max_size=8)),
)
def test_router_and_simulator_agree_with_vllm(algo, tokens, bs, seed, lora):
    want = vllm_recipe(tokens, bs, seed, lora, algo)
    assert BlockHasher(bs, algo, seed).hashes(tokens, lora_name=lora) == want
    assert sim_hashes(tokens, bs, seed, lora, algo) == want


def test_max_blocks_and_partial_block():
    h = BlockHasher(4)
    toks = list(range(100, 118))  # 4 full blocks + 2 tokens
    full = h.hashes(toks)
    assert len(full) == 4
    assert h.hashes(toks, max_blocks=2) == full[:2]


def test_fold_hash_bytes_and_ints():
    d = hashlib.sha256(b"x").digest()
    assert fold_hash(d) == int.from_bytes(d, "big") & MASK64
    assert fold_hash(-1) == MASK64
    assert fold_hash(5) == 5


def test_unknown_algo_rejected():
    with pytest.raises(ValueError):
        BlockHasher(16, "xxhash")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        VllmBlockHasher("xxhash")  # type: ignore[arg-type]
