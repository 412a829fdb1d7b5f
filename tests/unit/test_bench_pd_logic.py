"""Pure logic of the PD benchmark: workload shape, chunk timing, the max-rate rule."""

from __future__ import annotations

import asyncio

import pytest

from loadtest.pd_bench import report
from loadtest.pd_bench.client import _Conn
from loadtest.pd_bench.workload import WorkloadSpec, generate_phase, template_tokens
from loadtest.simulator.tokenizer import load_codec, render_chat

SPEC = WorkloadSpec(prompt_len=600, output_len=8, requests_per_rate=40, followup_share=0.5,
                    followup_new_min=16, followup_new_max=256, followup_min_gap_s=1.0, seed=3)


def test_prompts_have_the_exact_length_and_followups_share_their_parents_prefix() -> None:
    reqs = generate_phase(SPEC, 4.0, 0)
    assert len(reqs) == 40 and reqs == generate_phase(SPEC, 4.0, 0)  # a function of the seed
    assert reqs != generate_phase(SPEC, 4.0, 1)
    codec = load_codec()
    by_index = {r.index: r for r in reqs}
    follow = [r for r in reqs if r.parent is not None]
    assert 5 <= len(follow) <= 30
    for r in reqs[:5] + follow[:5]:
        ids = codec.encode(render_chat(r.chat_body("m")["messages"]))
        assert len(ids) == SPEC.prompt_len
    content = SPEC.prompt_len - template_tokens()
    for r in follow:
        parent = by_index[r.parent]
        assert parent.parent is None and parent.offset_s <= r.offset_s - SPEC.followup_min_gap_s
        assert 16 <= r.new_tokens <= 256
        assert r.words[:content - r.new_tokens] == parent.words[:content - r.new_tokens]
        assert r.words != parent.words
    offsets = [r.offset_s for r in reqs]
    assert offsets == sorted(offsets) and offsets[0] == 0.0


def test_duration_per_rate_sets_the_count() -> None:
    spec = WorkloadSpec(duration_per_rate=2.5)
    assert spec.requests_at(4.0) == 10 and spec.requests_at(0.1) == 1


def _events(*contents: str) -> bytes:
    return b"".join(b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % c.encode() for c in contents)


def test_content_events_are_counted_once_across_split_reads() -> None:
    async def go() -> list[float]:
        c = _Conn()
        c._fut = asyncio.get_running_loop().create_future()  # as request() leaves it
        c.times = []
        body = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n' + _events(
            "a", "b", "c", "") + _events("d") + b"data: [DONE]\n\n"
        for cut in range(0, len(body), 7):  # reads that split every pattern somewhere
            c._body_data(body[cut:cut + 7])
        return c.times

    assert len(asyncio.run(go())) == 4  # role chunk and empty content not counted


def _phase(rate: float, itl99: float, ttft99: float = 100.0, valid: bool = True, failed: int = 0) -> dict:
    return {"rate": rate, "valid": valid, "failed": failed,
            "itl_ms": {"p99": itl99}, "ttft_ms": {"p99": ttft99}}


def test_max_rate_is_the_highest_rate_before_the_first_miss() -> None:
    phases = [_phase(1, 10), _phase(2, 40), _phase(4, 60), _phase(8, 20)]
    assert report.max_rate(phases, 50.0) == 2
    assert report.max_rate(phases, 50.0, ttft_slo_ms=50.0) is None
    assert report.max_rate([_phase(1, 60)], 50.0) is None
    # a phase that cannot tell (lagged, skipped) or had failures ends the scan
    assert report.max_rate([_phase(1, 10), _phase(2, 10, valid=False), _phase(4, 10)], 50.0) == 1
    assert report.max_rate([_phase(1, 10), {"rate": 2, "skipped": "stopped"}], 50.0) == 1
    assert report.max_rate([_phase(1, 10), _phase(2, 10, failed=1)], 50.0) == 1
    assert report.max_rate([_phase(1, 10), _phase(2, 10, ttft99=3000)], 50.0, 2000.0) == 1


@pytest.mark.parametrize("vals,expected", [([], None), ([0.001, 0.002, 0.003], 2.0)])
def test_dist_ms(vals: list[float], expected: float | None) -> None:
    assert report.dist_ms(vals)["p50"] == (pytest.approx(expected) if expected else None)
