"""Cost of rendering a chat request to canonical prompt bytes (prefix-cache input).
Run with --benchmark-only."""

import pytest

from kthena_router.scheduling.render import render_chat, render_completion

SIZES = {"16KiB": 16 << 10, "100KiB": 100 << 10}
LINE = 'The quick brown fox jumps over the "lazy" dog, café. '


def _chat(size: int) -> list[dict]:
    """A system prompt, a tool exchange and alternating turns: about `size` bytes of text."""
    n_turns = 8
    per = size // (n_turns + 1)
    text = (LINE * (per // len(LINE) + 1))[:per]
    msgs: list[dict] = [{"role": "system", "content": text}]
    for i in range(n_turns):
        if i == 3:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "fox"}'}}]})
            msgs.append({"role": "tool", "tool_call_id": "c1", "content": text})
        elif i % 2 == 0:
            msgs.append({"role": "user", "content": [{"type": "text", "text": text},
                                                     {"type": "image_url", "image_url": {"url": "https://x/i.png"}}]})
        else:
            msgs.append({"role": "assistant", "content": text})
    return msgs


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_render_chat(benchmark, size):
    msgs = _chat(SIZES[size])
    out = benchmark(render_chat, msgs)
    assert len(out) >= SIZES[size] * 0.95


@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_bench_render_completion(benchmark, size):
    prompt = (LINE * (SIZES[size] // len(LINE) + 1))[: SIZES[size]]
    assert len(benchmark(render_completion, prompt)) >= SIZES[size]
