"""prefix-hash-bounded in the scheduler glue: the key from the leading prompt blocks, the
endpoint's address (not the process's id) as what is hashed, the bound from in-flight
counts, the config's arguments (errors name the field)."""

from __future__ import annotations

import pytest
from test_scheduling_scheduler import KEY, chat, endpoints, fresh, sched

from kthena_router import _core
from kthena_router.config.errors import ConfigError
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.scheduling.request import RequestInfo


def cfg(args: str = "") -> str:
    pc = f"  pluginConfig:\n  - name: prefix-hash-bounded\n    args: {{{args}}}\n" if args else ""
    return f"scheduler:\n{pc}  plugins:\n    Score:\n      enabled:\n      - {{name: prefix-hash-bounded, weight: 1}}\n"


def completion(rid: str, prompt: str) -> RequestInfo:
    return RequestInfo(rid, "/v1/completions", {"model": "demo", "prompt": prompt}, "demo", "", "demo")


def test_prefix_key_is_the_chain_hash_of_the_leading_blocks():
    seed = _core.prefix_seed(b"demo", b"")
    p = b"x" * 64 * 20
    assert _core.prefix_key(p, 64, seed, 16) == _core.prefix_hashes(p, 64, seed, 16).tolist()[-1]
    assert _core.prefix_key(p + b"tail", 64, seed, 16) == _core.prefix_key(p + b"other", 64, seed, 16)
    assert _core.prefix_key(b"short", 64, seed, 16) != _core.prefix_key(b"shore", 64, seed, 16)
    with pytest.raises(ValueError):
        _core.prefix_key(p, 0, seed, 16)


def test_same_prefix_same_engine_across_schedulers_with_other_ids():
    eps = endpoints(4)
    a, _ = sched(cfg())
    b, _ = sched(cfg())
    b.sync({KEY: tuple(reversed(eps))})  # another interning order: other ids for the same addresses
    fresh(a, eps)
    fresh(b, eps)
    assert a.endpoint_id(eps[0].key) != b.endpoint_id(eps[0].key)
    firsts = set()
    for q in range(40):
        # the system prompt fills the first 1 KiB: the question does not change the key
        pa = a.candidates(KEY, eps, chat(f"a{q}", f"question {q}"))[0]
        pb = b.candidates(KEY, eps, chat(f"b{q}", f"another {q}"))[0]
        assert pa is pb
        firsts.add(pa.key)
    assert len(firsts) == 1
    # another leading prefix is another key: over many, every engine gets some
    spread = {a.candidates(KEY, eps, completion(f"c{i}", f"doc {i} " * 200))[0].key for i in range(64)}
    assert len(spread) == 4


def test_load_bound_spills_a_hot_prefix_in_the_same_order():
    eps = endpoints(3)
    s, _ = sched(cfg("loadFactor: 1.5"))
    fresh(s, eps)
    order = s.candidates(KEY, eps, chat("r0", "q"))
    placed = []
    for i in range(9):  # never finished: in flight grows
        ep = s.candidates(KEY, eps, chat(f"r{i}", "q"))[0]
        load = sum(p is ep for p in placed)
        assert load < -(-1.5 * (len(placed) + 1) // 3), (i, load)  # under ceil(c * m / n)
        s.dispatched(ep, None)
        placed.append(ep)
    counts = [sum(p is e for p in placed) for e in order]
    # c = 1.5 over 3 engines: the key's first two engines carry it, in the key's order
    assert counts == [5, 4, 0], counts
    for ep in placed:
        s.finished(ep)
    assert s.candidates(KEY, eps, chat("again", "q"))[0] is order[0]  # load gone: back home


def test_arguments_are_validated_by_name():
    with pytest.raises(ConfigError) as e:
        load_router_configuration_bytes(cfg("loadFactor: 0.9"), source="r.yaml")
    assert e.value.field == "scheduler.pluginConfig[0].args.loadFactor"
    assert "between 1 and 100" in e.value.message
    with pytest.raises(ConfigError) as e:
        load_router_configuration_bytes(cfg("prefixKeyBlock: 4"), source="r.yaml")
    assert e.value.field == "scheduler.pluginConfig[0].args.prefixKeyBlock"
    a = load_router_configuration_bytes(cfg("prefixKeyBlocks: 4, blockSizeToHash: 16"), source="r.yaml")
    args = a.scheduler.args["prefix-hash-bounded"]
    assert (args.prefix_key_blocks, args.block_size_to_hash, args.load_factor) == (4, 16, 1.25)


def test_an_ejected_home_engine_hands_its_prefix_to_the_next_in_order():
    eps = endpoints(4)
    s, _ = sched(cfg())
    fresh(s, eps)
    order = s.candidates(KEY, eps, chat("r0", "q"))
    order[0].health.healthy = False
    assert s.candidates(KEY, eps, chat("r1", "q")) == order[1:]
    order[0].health.healthy = True
    assert s.candidates(KEY, eps, chat("r2", "q")) == order
