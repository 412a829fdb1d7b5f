"""The issue-15 workload generators: seeded determinism and the shape of each distribution."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from loadtest.shared_prefix.hard_workloads import (
    HARD_PROFILES, LORA_NAMES, BurstSpec, LoraSpec, MixedSpec, MultiTurnSpec, ZipfSpec,
    log_uniform_int, with_overrides, zipf_weights,
)


def _fingerprint(spec):  # type: ignore[no-untyped-def]
    plan = spec.plan()
    return ([(r.group, r.kind, r.messages, r.max_tokens, r.model) for r in plan.requests],
            plan.starts, plan.thinks)


@pytest.mark.parametrize("name", sorted(HARD_PROFILES))
def test_same_seed_same_plan_other_seed_other_plan(name: str) -> None:
    spec = HARD_PROFILES[name]
    a, b = _fingerprint(replace(spec, seed=4)), _fingerprint(replace(spec, seed=4))
    assert a == b
    c = _fingerprint(replace(spec, seed=5))
    assert a[0] != c[0] and a[1] != c[1]


def test_zipf_weights() -> None:
    w = zipf_weights(12, 1.1)
    assert sum(w) == pytest.approx(1.0)
    assert all(x > y for x, y in zip(w, w[1:]))
    assert w[0] / w[1] == pytest.approx(2 ** 1.1)


def test_zipf_group_popularity_is_skewed_and_hot_groups_exceed_one_engine() -> None:
    spec = replace(ZipfSpec(), num_requests=3000, system_len=8, question_len=4, seed=4)
    counts = Counter(r.group for r in spec.plan().requests)
    share = [counts[g] / 3000 for g in range(spec.num_groups)]
    expected = zipf_weights(spec.num_groups, spec.zipf_s)
    assert share[0] == pytest.approx(expected[0], abs=0.03)
    assert share[0] > 3 * share[5] > 0
    # the two hottest groups need more than one of the three engines at the stated rate
    assert (share[0] + share[1]) * 3 > 1.2
    reqs = ZipfSpec(seed=4).plan().requests[:5]
    assert all(len(r.messages[0][1].split()) == 4096 for r in reqs)


def test_multiturn_prompts_grow_by_reply_and_question() -> None:
    plan = MultiTurnSpec(seed=4).plan()
    turns = [len(s) for s in plan.sessions]
    assert min(turns) >= 1 and max(turns) <= 10 and sum(turns) / len(turns) > 3
    for session, thinks in zip(plan.sessions, plan.thinks):
        assert thinks[0] == 0.0 and all(t > 0 for t in thinks[1:])
        for prev, cur in zip(session, session[1:]):
            # previous prompt + its reply (max_tokens words) + a new question
            assert cur.messages[:len(prev.messages)] == prev.messages
            assert cur.messages[len(prev.messages)][0] == "assistant"
            assert len(cur.messages[len(prev.messages)][1].split()) == prev.max_tokens
            assert cur.messages[-1][0] == "user" and len(cur.messages) == len(prev.messages) + 2
            assert cur.prompt_tokens > prev.prompt_tokens + prev.max_tokens
        assert all(r.prompt_tokens + r.max_tokens <= 16384 for r in session)
    assert max(r.prompt_tokens for r in plan.requests) > 10000
    thinks = [t for th in plan.thinks for t in th[1:]]
    assert sum(thinks) / len(thinks) == pytest.approx(0.5, rel=0.25)


def test_mixed_lengths_follow_the_mix() -> None:
    spec = replace(MixedSpec(), num_requests=600, long_len=64, doc_len=(40, 80), seed=4)
    reqs = spec.plan().requests
    kinds = Counter(r.kind for r in reqs)
    assert kinds["chat"] / 600 == pytest.approx(0.6, abs=0.06)
    assert kinds["rag"] / 600 == pytest.approx(0.3, abs=0.06)
    assert kinds["long"] / 600 == pytest.approx(0.1, abs=0.04)
    assert all(200 <= r.prompt_tokens <= 800 for r in reqs if r.kind == "chat")
    rag = [r for r in reqs if r.kind == "rag"]
    assert {r.group for r in rag} <= set(range(50)) and len({r.group for r in rag}) > 30
    by_doc: dict[int, str] = {}
    for r in rag:  # one shared document text per group
        assert by_doc.setdefault(r.group, r.messages[0][1]) == r.messages[0][1]
    outs = [r.max_tokens for r in reqs]
    assert min(outs) >= 16 and max(outs) <= 1024
    assert sum(o < 128 for o in outs) / len(outs) == pytest.approx(0.5, abs=0.08)  # log-uniform
    full = MixedSpec(seed=4).plan().requests
    assert all(r.prompt_tokens == 32768 for r in full if r.kind == "long")
    assert all(4000 <= len(r.messages[0][1].split()) <= 8000 for r in full if r.kind == "rag")


def test_log_uniform_int_bounds() -> None:
    import random
    rng = random.Random(1)
    vals = [log_uniform_int(rng, 16, 1024) for _ in range(2000)]
    assert min(vals) >= 16 and max(vals) <= 1024 and max(vals) > 900


def test_burst_rate_steps() -> None:
    spec = replace(BurstSpec(), phases=((20.0, 0.5), (15.0, 2.0), (25.0, 0.5)), seed=4)
    import random
    starts = spec.arrival_times(random.Random(4))
    assert starts == sorted(starts)
    t = 0.0
    for dur, mult in spec.phases:
        n = sum(t <= s < t + dur for s in starts)
        assert n / dur == pytest.approx(spec.capacity * mult, rel=0.1)
        t += dur
    plan = BurstSpec(seed=4).plan()
    assert len(plan.requests) == len(plan.starts) and max(plan.starts) < 6.0


def test_lora_adapter_popularity_and_engine_slots() -> None:
    spec = replace(LoraSpec(), num_requests=4000, system_len=8, question_len=4, seed=4)
    counts = Counter(r.model for r in spec.plan().requests)
    assert set(counts) == set(LORA_NAMES)
    shares = [counts[n] / 4000 for n in LORA_NAMES]
    assert shares[0] == pytest.approx(zipf_weights(8, 1.2)[0], abs=0.03)
    assert shares[0] > 5 * shares[-1]
    args = LoraSpec().engine_args
    assert args[args.index("--max-loras") + 1] == "4"
    assert set(LORA_NAMES) <= set(args)
    req = spec.plan().requests[0]
    assert req.chat_body("base")["model"] == req.model
    assert ZipfSpec(seed=4).plan().requests[0].chat_body("base")["model"] == "base"


def test_overrides_parse_as_the_fields_type_and_refuse_the_rest() -> None:
    spec = with_overrides(ZipfSpec(name="zipf"), ["rate=130", "num-groups=8", "time_scale=12"])
    assert (spec.rate, spec.num_groups, spec.time_scale) == (130.0, 8, 12.0)
    assert isinstance(spec.num_groups, int) and spec.name == "zipf"
    assert with_overrides(spec, []) == spec
    for bad in (["rate"], ["nope=1"], ["seed=3"], ["num_groups=1.5"], ["engine_args=x"]):
        with pytest.raises(ValueError):
            with_overrides(LoraSpec(), bad) if bad == ["engine_args=x"] else with_overrides(spec, bad)


def _summary(rate: float, cells: dict[str, list[tuple[float, bool]]]) -> dict:  # type: ignore[type-arg]
    rows = {name: {"cells": [{"seed": i + 1, "accepted": acc,
                              "metrics": {"req_s": rate, "ttft_p90_s": p90, "hit_rate": 0.9}}
                             for i, (p90, acc) in enumerate(cs)]}
            for name, cs in cells.items()}
    return {"workload": {"kind": "ZipfSpec", "rate": rate}, "tables": [{"rows": rows}]}


def test_goodput_is_the_highest_rate_every_accepted_seed_kept_the_slo() -> None:
    from loadtest.shared_prefix.hard_goodput import collect, goodput, markdown
    runs = [_summary(100, {"a": [(0.1, True), (0.2, True)], "b": [(0.1, True), (0.3, True)]}),
            _summary(150, {"a": [(0.2, True), (0.9, False)], "b": [(0.4, True), (0.1, True)]}),
            _summary(200, {"a": [(0.6, True), (0.1, True)], "b": [(0.1, False)]})]
    data = collect(runs)
    assert goodput(data["a"], 0.25) == 150  # the rejected 0.9 s cell does not count
    assert goodput(data["b"], 0.25) is None  # seed 2 at 100/s missed the SLO
    assert goodput(data["b"], 0.35) == 100  # 150/s: seed 1 missed; 200/s: nothing accepted
    # a miss at a lower rate ends the goodput even if a higher rate passed
    assert goodput({100: [{"ttft_p90_s": 0.5}], 150: [{"ttft_p90_s": 0.1}]}, 0.25) is None
    text = markdown(runs, 0.25)
    assert "| a |" in text and text.strip().splitlines()[-1].endswith("| - |")


def test_runner_set_overrides_hard_profiles_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from loadtest.shared_prefix.runner import parse_args
    a = parse_args(["--profile", "zipf", "--set", "rate=130", "--out", str(tmp_path)])
    assert a.hard_spec.rate == 130.0 and a.time_scale == a.hard_spec.time_scale
    assert parse_args(["--profile", "zipf", "--out", str(tmp_path)]).hard_spec == HARD_PROFILES["zipf"]
    for argv in (["--profile", "ci", "--set", "rate=1"], ["--profile", "zipf", "--set", "nope=1"],
                 ["--profile", "zipf", "--request-rate", "130"]):  # refused, not ignored
        with pytest.raises(SystemExit):
            parse_args([*argv, "--out", str(tmp_path)])
