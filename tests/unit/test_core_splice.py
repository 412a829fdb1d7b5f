"""kthena_router._core.splice_top_level: byte-level rewrite of top-level JSON members."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kthena_router._core import splice_top_level

# Strings that stress the scanner: quotes, backslashes, braces/brackets, escapes, unicode.
tricky_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['"', "\\", '\\"', "}", "{", "]", "[", '"}', "\\\\", "model", "\u2028", "é", "😀", "\x00", "\n"]),
    st.text(alphabet='"\\{}[]:, \n\tab\u00e9\U0001f600', max_size=20),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    tricky_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(tricky_text, st.sampled_from(["model", "stream_options"])), inner, max_size=5),
    ),
    max_leaves=30,
)
json_objects = st.dictionaries(st.one_of(tricky_text, st.sampled_from(["model", "stream_options", "a"])), json_values, max_size=8)
rep_keys = st.sampled_from(["model", "stream_options", "a", "", "x y", "é", "😀"])
replacements = st.lists(st.tuples(rep_keys, json_values), max_size=4)


def _encode(reps):
    return [(k.encode(), orjson.dumps(v)) for k, v in reps]


def _expected(obj, reps):
    return {**obj, **{k: v for k, v in reps}}


def _check(body: bytes, obj, reps):
    out = splice_top_level(body, _encode(reps))
    got = orjson.loads(out)
    want = _expected(obj, reps)
    assert got == want
    assert list(got) == list(want)  # same key order as the dict merge


@settings(max_examples=100, deadline=None)
@given(json_objects, replacements)
def test_property_compact(obj, reps):
    _check(orjson.dumps(obj), obj, reps)


@settings(max_examples=100, deadline=None)
@given(json_objects, replacements)
def test_property_pretty(obj, reps):
    _check(orjson.dumps(obj, option=orjson.OPT_INDENT_2), obj, reps)


@settings(max_examples=100, deadline=None)
@given(json_objects, replacements, st.sampled_from([None, 1, 3]), st.sampled_from([(",", ":"), (" ,  ", " : ")]))
def test_property_ascii_escaped_and_odd_whitespace(obj, reps, indent, seps):
    # ensure_ascii spells non-ASCII keys as \uXXXX: not matched on raw bytes, so such a key
    # is appended instead, and being last it still wins for a last-wins parser.
    body = json.dumps(obj, ensure_ascii=True, indent=indent, separators=seps).encode()
    _check(b" \n" + body + b"\r\n", obj, reps)


@settings(max_examples=50, deadline=None)
@given(json_objects)
def test_property_no_replacement_is_identity(obj):
    body = orjson.dumps(obj, option=orjson.OPT_INDENT_2)
    assert splice_top_level(body, []) == body


def test_unknown_fields_and_numbers_untouched_byte_for_byte():
    body = b'{"x": 1.000, "y": 1E+2,"model" :"old" , "n":{"model":"keep"}}'
    out = splice_top_level(body, [(b"model", b'"new"')])
    assert out == b'{"x": 1.000, "y": 1E+2,"model" :"new" , "n":{"model":"keep"}}'


def test_append_to_empty_object_and_absent_key():
    assert splice_top_level(b"{}", [(b"model", b'"m"')]) == b'{"model":"m"}'
    assert splice_top_level(b'{"a":1}', [(b"stream_options", b'{"include_usage":true}')]) == (
        b'{"a":1,"stream_options":{"include_usage":true}}'
    )


def test_duplicate_top_level_keys_all_replaced():
    out = splice_top_level(b'{"model":"a","b":1,"model":"c"}', [(b"model", b'"z"')])
    assert out == b'{"model":"z","b":1,"model":"z"}'


def test_escaped_key_spelling_is_appended_and_wins():
    body = b'{"mod\\u0065l":"a"}'
    out = splice_top_level(body, [(b"model", b'"z"')])
    assert out == b'{"mod\\u0065l":"a","model":"z"}'
    assert orjson.loads(out) == {"model": "z"}


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b"{", b'{"a":1', b'{"a":1,}', b'{"a":"x}', b'{"a":[1}', b'{"a":1}x', b"{a:1}", b'{"a":}'],
)
def test_invalid_json_raises_value_error(body):
    with pytest.raises(ValueError):
        splice_top_level(body, [(b"model", b"1")])


def test_bad_key_raises_value_error():
    with pytest.raises(ValueError):
        splice_top_level(b"{}", [(b'a"b', b"1")])


def test_type_errors():
    with pytest.raises(TypeError):
        splice_top_level("{}", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        splice_top_level(b"{}", [("model", b"1")])  # type: ignore[list-item]


def test_large_body_gil_released_path():
    # Over the 64 KiB threshold: the GIL-released path must give the same result.
    big = {"messages": [{"role": "user", "content": 'x"\\{' * 50_000}], "model": "a", "ids": list(range(20_000))}
    body = orjson.dumps(big)
    assert len(body) > 64 * 1024
    out = splice_top_level(body, [(b"model", b'"b"'), (b"stream", b"true")])
    assert orjson.loads(out) == {**big, "model": "b", "stream": True}
