"""Parity of the Rust prompt renderer (rust/py/src/front/render.rs, `_core.render_prompt`) with
kthena_router/scheduling/render.py: whenever Rust renders a body, its bytes are Python's
(`render_request(orjson.loads(body), chat)`, which then does not fail); for the shapes it
covers, it never declines. Bodies are written as JSON text by hand, so that key order,
duplicate keys, escapes and number spellings orjson reads its own way are all exercised."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kthena_router import _core
from kthena_router.scheduling.render import render_request

PROPS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MESSAGE_KEYS = ("role", "name", "tool_call_id", "content", "tool_calls")
PART_KEYS = ("type", "text", "image_url")


class Obj:
    """A JSON object as written: key order and duplicate keys kept."""

    def __init__(self, items: list[tuple[Any, Any]]) -> None:
        self.items = items


class Raw:
    """JSON text written verbatim (a key or a value)."""

    def __init__(self, text: str) -> None:
        self.text = text


def enc(v: Any, ascii_only: bool) -> str:
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, Obj):
        return "{" + ",".join(f"{enc(k, ascii_only)}:{enc(x, ascii_only)}" for k, x in v.items) + "}"
    if isinstance(v, list):
        return "[" + ",".join(enc(x, ascii_only) for x in v) + "]"
    return json.dumps(v, ensure_ascii=ascii_only)


def python(body: bytes, chat: bool) -> bytes | None:
    """What RequestInfo.prompt() gets for this body (None: it fails)."""
    try:
        return render_request(orjson.loads(body), chat)
    except (ValueError, TypeError, AttributeError, RecursionError):  # JSONDecodeError is a ValueError
        return None


def check(body: bytes, chat: bool) -> bytes | None:
    got = _core.render_prompt(body, chat)
    if got is not None:
        assert got == python(body, chat), body
    return got


# --- values ---------------------------------------------------------------------------------

text = (st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
        | st.sampled_from(["", "\n", "<|im_end|>", "\U0001f600", "\x00", "\\", '"', "role", " name=x"]))
# Spellings orjson reads in its own way, or refuses (a lone surrogate, a double's overflow).
odd_raw = st.sampled_from([Raw(t) for t in (
    "-0", "1.0", "1e2", "1E400", "-1e400", "18446744073709551616", "4294967296", "-1", "0.0",
    '"\\ud800"', '"\\udc00x"', '"\\ud83d\\ude00"', '"\\u0000"', '"a\\/b"', "[ ]", "{ }", " true ")])
ids = st.integers(0, 2**32 - 1)


def objects(keys: st.SearchStrategy[Any], values: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    return st.dictionaries(keys, values, max_size=3).map(lambda d: Obj(list(d.items())))


valid_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda kids: st.lists(kids, max_size=3) | objects(text, kids), max_leaves=5)
any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | text | odd_raw,
    lambda kids: st.lists(kids, max_size=3) | objects(text, kids), max_leaves=5)


def key(name: str) -> st.SearchStrategy[Any]:
    """A key as written: plain, or with its first letter escaped (orjson decodes both)."""
    return st.sampled_from([name, Raw('"\\u%04x%s"' % (ord(name[0]), name[1:]))])


def extras(read: tuple[str, ...]) -> st.SearchStrategy[list[tuple[Any, Any]]]:
    return st.dictionaries(text.filter(lambda k: k not in read), valid_json, max_size=2).map(lambda d: list(d.items()))


@st.composite
def shuffled(draw: st.DrawFn, fixed: list[tuple[Any, Any]], read: tuple[str, ...]) -> Obj:
    return Obj(draw(st.permutations(fixed + draw(extras(read)))))


# --- covered shapes ---------------------------------------------------------------------------

@st.composite
def covered_part(draw: st.DrawFn) -> Obj:
    if draw(st.booleans()):
        items = [(draw(key("type")), draw(st.sampled_from(["text", "input_text", "output_text"]))),
                 (draw(key("text")), draw(text))]
        if draw(st.booleans()):
            items.append(("image_url", draw(valid_json)))  # read only for image parts
    else:
        url = draw(text)
        img = url if draw(st.booleans()) else draw(shuffled([(draw(key("url")), url)], ("url",)))
        items = [("type", "image_url"), (draw(key("image_url")), img)]
        if draw(st.booleans()):
            items.append(("text", draw(valid_json)))  # read only for text parts
    return draw(shuffled(items, PART_KEYS))


@st.composite
def covered_message(draw: st.DrawFn) -> Obj:
    items: list[tuple[Any, Any]] = [(draw(key("role")), draw(text))]
    for name in ("name", "tool_call_id"):
        if draw(st.booleans()):
            items.append((draw(key(name)), draw(st.none() | text)))
    content = draw(st.sampled_from(["absent", "null", "str", "parts"]))
    if content != "absent":
        value = {"null": None, "str": draw(text), "parts": draw(st.lists(covered_part(), max_size=4))}[content]
        items.append((draw(key("content")), value))
    if draw(st.booleans()):
        items.append(("tool_calls", None))
    return draw(shuffled(items, MESSAGE_KEYS))


falsy_tools = st.sampled_from([None, [], Raw("[ ]"), Obj([]), "", False, 0])


@st.composite
def covered_chat(draw: st.DrawFn) -> Obj:
    items: list[tuple[Any, Any]] = [("model", "m"), (draw(key("messages")), draw(st.lists(covered_message(), max_size=4)))]
    if draw(st.booleans()):
        items.append(("tools", draw(falsy_tools)))
    if draw(st.booleans()):
        items.append(("prompt", draw(valid_json)))  # not read for chat
    return draw(shuffled(items, ("messages", "tools")))


token_list = st.lists(ids, max_size=6)
covered_prompt = (text | token_list
                  | st.lists(text | token_list, min_size=1, max_size=4))


@st.composite
def covered_completion(draw: st.DrawFn) -> Obj:
    items = [("model", "m"), (draw(key("prompt")), draw(covered_prompt))]
    if draw(st.booleans()):
        items.append(("messages", draw(valid_json)))  # not read for completions
    return draw(shuffled(items, ("prompt",)))


# --- anything nearby ----------------------------------------------------------------------------

@st.composite
def duplicated(draw: st.DrawFn, obj: Obj, values: st.SearchStrategy[Any]) -> Obj:
    """`obj` with one of its keys written twice (orjson keeps the last)."""
    if not obj.items:
        return obj
    k, v = draw(st.sampled_from(obj.items))
    again = v if draw(st.booleans()) else draw(values)
    return Obj(draw(st.permutations(obj.items + [(k, again)])))


# Values next to the covered ones, by the key they stand at (Python renders most of them).
near = st.sampled_from([True, False, 0, 1, -1, 0.0, 1.5, "", "x", [], [None], [0], [{}], Obj([]), Obj([("a", 1)]),
                        Raw("-0"), Raw("0.0"), Raw("[0]")]) | any_json
NEAR = {
    "type": st.sampled_from(["image", "image_url ", "Text", "input_audio", "refusal", "file", "text\x00", "texts",
                             "output_textx", ""]) | near,
    "text": near, "image_url": near | objects(st.just("url") | text, near), "url": near,
    "role": near, "name": near, "tool_call_id": near, "content": near | st.lists(near, max_size=2),
    "tool_calls": st.sampled_from([[], [Obj([("function", Obj([("name", "f"), ("arguments", "{}")]))])], {}, "x", 0,
                                   False]) | near,
    "tools": near,
}


@st.composite
def mutated(draw: st.DrawFn, obj: Obj, keys: tuple[str, ...]) -> Obj:
    """`obj` with one of `keys` set to a value next to the covered ones (or written twice)."""
    k = draw(st.sampled_from(keys))
    value = draw(NEAR[k])
    if draw(st.integers(0, 3)) == 0:
        return Obj(draw(st.permutations(obj.items + [(k, value)])))  # a duplicate, when k is there
    kept = [(a, v) for a, v in obj.items if a != k]
    return Obj(draw(st.permutations(kept + [(k, value)])))


odd_part = (covered_part().flatmap(lambda o: mutated(o, PART_KEYS))
            | NEAR["url"].map(lambda u: Obj([("type", "image_url"), ("image_url", Obj([("url", u)]))]))
            | any_json)
odd_message = (covered_message().flatmap(lambda o: mutated(o, MESSAGE_KEYS))
               | st.tuples(covered_message(), st.lists(odd_part, min_size=1, max_size=2)).map(
                   lambda mp: Obj([(k, mp[1] if k == "content" else v) for k, v in mp[0].items]
                                  + ([] if any(k == "content" for k, _ in mp[0].items) else [("content", mp[1])])))
               | objects(st.sampled_from(MESSAGE_KEYS) | text, any_json)
               | any_json)
odd_ids = st.lists(st.integers(-(2**33), 2**33) | st.sampled_from([2**32, 2**32 - 1, -1, 0]) | st.booleans()
                   | st.floats(allow_nan=False, allow_infinity=False) | odd_raw, max_size=4)
odd_prompt = covered_prompt | odd_ids | st.lists(text | odd_ids | token_list | any_json, max_size=4) | any_json


@st.composite
def odd_chat(draw: st.DrawFn) -> Any:
    """Covered messages with at most one odd one, `tools` anything; now and then odder still."""
    messages: Any = draw(st.lists(covered_message(), max_size=3))
    if draw(st.booleans()):
        messages.insert(draw(st.integers(0, len(messages))), draw(odd_message))
    if draw(st.integers(0, 9)) == 0:
        messages = draw(any_json)
    items = [("messages", messages)]
    if draw(st.booleans()):
        items.append(("tools", draw(falsy_tools | NEAR["tools"])))
    body = draw(shuffled(items, ("messages", "tools")))
    return draw(st.just(body) | duplicated(body, any_json) | st.just(body) | any_json)


@st.composite
def odd_completion(draw: st.DrawFn) -> Any:
    body = draw(shuffled([("prompt", draw(odd_prompt))], ("prompt",)))
    return draw(st.just(body) | duplicated(body, any_json) | any_json)


# --- tests ----------------------------------------------------------------------------------------

@settings(PROPS, max_examples=100)
@given(body=covered_chat(), ascii_only=st.booleans())
def test_covered_chat_is_rendered_as_python_does(body: Obj, ascii_only: bool) -> None:
    raw = enc(body, ascii_only).encode()
    assert check(raw, True) is not None, raw


@PROPS
@given(body=covered_completion(), ascii_only=st.booleans())
def test_covered_completion_is_rendered_as_python_does(body: Obj, ascii_only: bool) -> None:
    raw = enc(body, ascii_only).encode()
    assert check(raw, False) is not None, raw


@settings(PROPS, max_examples=100)
@given(body=odd_chat(), ascii_only=st.booleans(), chat=st.booleans())
def test_any_chat_body_renders_as_python_or_declines(body: Any, ascii_only: bool, chat: bool) -> None:
    check(enc(body, ascii_only).encode(), chat)


@settings(PROPS, max_examples=200)
@given(body=odd_completion(), ascii_only=st.booleans())
def test_any_completion_body_renders_as_python_or_declines(body: Any, ascii_only: bool) -> None:
    check(enc(body, ascii_only).encode(), False)


def chat_body(messages: list[Any], tools: Any = None) -> bytes:
    return enc(Obj([("messages", messages)] + ([("tools", tools)] if tools is not None else [])), False).encode()


@settings(PROPS, max_examples=120)
@given(message=covered_message().flatmap(lambda o: mutated(o, MESSAGE_KEYS)))
def test_near_miss_message_renders_as_python_or_declines(message: Obj) -> None:
    check(chat_body([message]), True)


@settings(PROPS, max_examples=120)
@given(part=odd_part.filter(lambda p: isinstance(p, Obj)))
def test_near_miss_part_renders_as_python_or_declines(part: Obj) -> None:
    check(chat_body([Obj([("role", "user"), ("content", [{"type": "text", "text": "a"}, part])])]), True)


PART_TYPES = ["text", "input_text", "output_text", "image_url", "image", "image_url ", "Text", "input_audio", "refusal",
              "file", "text\x00", "texts", "output_textx", "", "imageurl"]


@pytest.mark.parametrize("kind", PART_TYPES)
def test_part_types(kind: str) -> None:
    for part in ({"type": kind, "text": "t"}, {"type": kind, "image_url": "u"}, {"type": kind, "image_url": {"url": "u"}},
                 {"type": kind, "text": "t", "image_url": "u"}):
        got = check(chat_body([Obj([("role", "user"), ("content", [part])])]), True)
        covered = "text" in part if kind in PART_TYPES[:3] else kind == "image_url" and "image_url" in part
        assert (got is not None) == covered, part


@settings(PROPS, max_examples=60)
@given(tools=NEAR["tools"])
def test_near_miss_tools_render_as_python_or_decline(tools: Any) -> None:
    check(chat_body([Obj([("role", "user"), ("content", "x")])], tools), True)


@PROPS
@given(raw=st.binary(max_size=200), chat=st.booleans())
def test_any_bytes_render_as_python_or_decline(raw: bytes, chat: bool) -> None:
    check(raw, chat)


@pytest.mark.parametrize(("body", "chat", "rendered"), [
    (b'{"messages":[{"role":"user","content":"hi"}]}', True, True),
    (b'{"messages":[{"content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}],'
     b'"role":"user","name":"n"}],"tools":[]}', True, True),
    (b'{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}', True, False),
    (b'{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}', True, False),
    (b'{"messages":[{"role":"user","content":"a","content":"b"}]}', True, False),
    (b'{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}', True, False),
    (b'{"messages":[{"role":"user","x":"\\ud800"}]}', True, False),
    (b'{"messages":"hi"}', True, False),
    (b'{"prompt":"hello"}', False, True),
    (b'{"prompt":[1,2,4294967295]}', False, True),
    (b'{"prompt":["a",[1,2],""]}', False, True),
    (b'{"prompt":[[]]}', False, True),
    (b'{"prompt":[1,"a"]}', False, False),
    (b'{"prompt":[4294967296]}', False, False),
    (b'{"prompt":[1.0]}', False, False),
    (b'{"prompt":[true]}', False, False),
    (b'{"prompt":"a","prompt":"a"}', False, False),
])
def test_examples(body: bytes, chat: bool, rendered: bool) -> None:
    got = check(body, chat)
    assert (got is not None) == rendered
    if rendered:
        assert got == python(body, chat)
