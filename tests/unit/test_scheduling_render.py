"""Canonical prompt bytes: determinism, shared prefixes, every content shape."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router.scheduling.render import render_chat, render_completion, render_request

TEXT = st.text(max_size=200)
PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, st.text(min_size=1, max_size=50)),
)
CALL = st.builds(lambda n, a: {"id": "c1", "type": "function", "function": {"name": n, "arguments": a}},
                 st.text(min_size=1, max_size=20), TEXT)
MESSAGE = st.one_of(
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["system", "user", "assistant"]),
              st.one_of(TEXT, st.lists(PART, max_size=4), st.none())),
    st.builds(lambda calls: {"role": "assistant", "content": None, "tool_calls": calls}, st.lists(CALL, min_size=1, max_size=3)),
    st.builds(lambda c: {"role": "tool", "tool_call_id": "c1", "content": c}, TEXT),
)
MESSAGES = st.lists(MESSAGE, max_size=6)


@settings(max_examples=200)
@given(MESSAGES)
def test_same_messages_same_bytes(messages):
    a = render_chat(messages)
    assert isinstance(a, bytes)
    assert render_chat(copy.deepcopy(messages)) == a
    # key order in the JSON object does not matter
    reordered = [dict(reversed(list(m.items()))) for m in messages]
    assert render_chat(reordered) == a


@settings(max_examples=200)
@given(system=st.text(min_size=1, max_size=500), a=MESSAGES, b=MESSAGES)
def test_shared_system_prompt_gives_shared_byte_prefix(system, a, b):
    sys_msg = {"role": "system", "content": system}
    ra, rb = render_chat([sys_msg, *a]), render_chat([sys_msg, *b])
    head = render_chat([sys_msg])
    assert ra.startswith(head) and rb.startswith(head)


@settings(max_examples=200)
@given(earlier=MESSAGES, extra=MESSAGES)
def test_earlier_turns_are_a_prefix_of_later_ones(earlier, extra):
    assert render_chat(earlier + extra).startswith(render_chat(earlier))


@settings(max_examples=100)
@given(doc=st.text(min_size=1, max_size=300), q1=TEXT, q2=TEXT)
def test_shared_start_of_a_user_message_is_shared(doc, q1, q2):
    a = render_chat([{"role": "user", "content": doc + q1}])
    b = render_chat([{"role": "user", "content": [{"type": "text", "text": doc}, {"type": "text", "text": q2}]}])
    common = render_chat([{"role": "user", "content": doc}])[: -len(b"<|im_end|>\n")]
    assert a.startswith(common) and b.startswith(common)


PLAIN = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]),
                           st.text(max_size=50).filter(lambda t: "<|" not in t)), max_size=5)


@settings(max_examples=300)
@given(PLAIN, PLAIN)
def test_different_messages_different_bytes(a, b):
    # Equivalent shapes (None, "" and [] content; text parts vs. their concatenation) are
    # meant to render alike; distinct plain conversations must not.
    ra = render_chat([{"role": r, "content": c} for r, c in a])
    rb = render_chat([{"role": r, "content": c} for r, c in b])
    assert (ra == rb) == (a == b)


def test_exact_form():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "What is "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
            {"type": "text", "text": "?"}, {"type": "input_audio", "input_audio": {"data": "QQ", "format": "wav"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{\"q\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]
    assert render_chat(msgs, tools) == (
        b'<|tools|>[{"function":{"name":"look","parameters":{"type":"object"}},"type":"function"}]<|/tools|>\n'
        b"<|im_start|>system\nBe brief.<|im_end|>\n"
        b"<|im_start|>user name=ann\nWhat is <|image|>data:image/png;base64,AAA<|/image|>?"
        b'<|input_audio|>{"input_audio":{"data":"QQ","format":"wav"},"type":"input_audio"}<|im_end|>\n'
        b'<|im_start|>assistant\n<|tool_call|>look\n{"q": 1}<|/tool_call|><|im_end|>\n'
        b"<|im_start|>tool tool_call_id=c1\nfound<|im_end|>\n"
    )


def test_images_and_tools_change_the_bytes():
    base = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]
    other = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/b.png"}}]}]
    assert render_chat(base) != render_chat(other)
    assert render_chat(base, [{"type": "function"}]) != render_chat(base)


def test_completion_prompt_forms():
    assert render_completion("héllo") == "héllo".encode()
    assert render_completion(["héllo"]) == "héllo".encode()
    assert render_completion([1, 2, 258]) == b"\x00ids\x00" + bytes([1, 0, 0, 0, 2, 0, 0, 0, 2, 1, 0, 0])
    assert render_completion([[1, 2]]) == render_completion([1, 2])
    assert render_completion(["a", "b"]) == b"a\x00\nb"
    assert render_completion("") == b"" and render_completion([]) == b""
    assert render_completion("12") != render_completion([12])


@pytest.mark.parametrize("bad", [None, 3, [1.5], [-1], [2**32], [["a"], 1], {"x": 1}])
def test_completion_rejects_bad_prompts(bad):
    with pytest.raises(ValueError):
        render_completion(bad)


def test_render_request():
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": None}
    assert render_request(body, chat=True) == render_chat(body["messages"])
    assert render_request({"prompt": "hi"}, chat=False) == b"hi"
    with pytest.raises(ValueError):
        render_request({"messages": "hi"}, chat=True)


def test_lone_surrogate_does_not_fail():
    assert render_chat([{"role": "user", "content": "\ud800"}])
