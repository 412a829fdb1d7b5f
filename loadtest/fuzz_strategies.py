"""Hypothesis strategies for adversarial router input, shared by the bad-input integration
tests (tests/integration/test_bad_input_*.py) and the fuzz driver (loadtest/fuzz_router.py).

They target the demo setup: model "demo" with LoRA adapters demo-lora-a and demo-lora-b.
"""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import strategies as st

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
KNOWN_MODELS = frozenset({"demo", "demo-lora-a", "demo-lora-b"})

# --- JSON values --------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4) |
                           st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)


def not_json_object(raw: bytes) -> bool:
    """Oracle: not a strict RFC 8259 JSON object (no NaN/Infinity, numbers that fit a
    double, UTF-8)."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_reject)
    except (ValueError, RecursionError):
        return True
    return not isinstance(value, dict) or _has_inf(value)


def _reject(name: str) -> Any:
    raise ValueError(name)


def _has_inf(value: Any) -> bool:
    # iterative: json.loads accepts nesting deeper than a recursive walk's stack allows
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


garbage_bodies = st.one_of(
    st.binary(min_size=1, max_size=200),
    st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")),
    # JSON-looking text, cut at a random place or with a bad byte in it
    st.builds(lambda v, cut: json.dumps({"model": "demo", "prompt": "x", "v": v}).encode()[:cut],
              json_values, st.integers(0, 40)),
    st.sampled_from([b"{", b"}", b"{\"model\"", b"{\"model\": \"demo\",}", b"{'model': 'demo'}",
                     b"{\"model\": \"demo\"} trailing", b"{\"model\": NaN}", b"{\"model\": Infinity}",
                     b"{\"model\": \"demo\", \"max_tokens\": 1e400}", b"\xef\xbb\xbf{\"model\": \"demo\"}",
                     b"{\"model\": \"d\xffmo\"}", b"{\"model\": \"\\ud800\"}", b"\x00", b"null",
                     b"{\"model\": \"demo\"\x00}", b"[" * 2000 + b"]" * 2000,
                     b"{\"a\":" * 1100 + b"1" + b"}" * 1100]),
).filter(not_json_object)

unknown_models = st.text(min_size=1, max_size=60).filter(lambda s: s not in KNOWN_MODELS)

# --- one field of a valid request with the wrong type ----------------------------------------

not_str = json_values.filter(lambda v: not isinstance(v, str))
not_bool = json_values.filter(lambda v: not isinstance(v, bool) and v is not None)
not_int = json_values.filter(lambda v: v is not None and (not isinstance(v, int) or isinstance(v, bool)))
not_list = json_values.filter(lambda v: not isinstance(v, list) and v is not None)
not_prompt = json_values.filter(lambda v: not isinstance(v, (list, str)) and v is not None)
not_dict = json_values.filter(lambda v: not isinstance(v, dict) and v is not None)

# (field, value, path): a request valid but for `field`, which the router names in its 400.
wrong_field = st.one_of(
    st.tuples(st.just("model"), st.one_of(not_str, st.just("")), st.sampled_from([CHAT, COMPL])),
    st.tuples(st.just("stream"), not_bool, st.sampled_from([CHAT, COMPL])),
    st.tuples(st.just("messages"), not_list, st.just(CHAT)),
    st.tuples(st.just("prompt"), not_prompt, st.just(COMPL)),
    st.tuples(st.just("max_tokens"), not_int, st.sampled_from([CHAT, COMPL])),
    st.tuples(st.just("max_completion_tokens"), not_int, st.just(CHAT)),
    st.tuples(st.just("stream_options"), not_dict, st.sampled_from([CHAT, COMPL])),
)

# --- odd but valid -------------------------------------------------------------------------

odd_unknown_fields = st.dictionaries(
    st.text(string.ascii_lowercase, min_size=1, max_size=6).map(lambda s: "x_" + s),
    json_values | st.integers(-(10**30), 10**30), max_size=4)
odd_text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30)

# Well-typed bodies whose messages / prompt / tools are nonsense (the scheduler renders them).
odd_messages = st.lists(
    json_values | st.fixed_dictionaries(
        {"role": json_values}, optional={"content": json_values, "name": json_values,
                                         "tool_calls": json_values, "tool_call_id": json_values}),
    max_size=4)
odd_prompts = json_values | st.lists(st.integers(-(2**40), 2**40), max_size=8) | \
    st.lists(st.lists(st.integers(-5, 2**33), max_size=4), max_size=3)

# --- wire level ----------------------------------------------------------------------------

wire_methods = st.sampled_from([b"POST", b"GET", b"PUT", b"HEAD", b"OPTIONS", b"DELETE", b"post",
                                b"P\x00ST", b""])
wire_paths = st.sampled_from([b"/v1/completions", b"/v1/chat/completions", b"/v1/models", b"/", b"*", b"",
                              b"/v1/%00", b"/v1/../admin", b"//v1/completions", b"/v1/completions?x=\xff",
                              b"http://127.0.0.1:1/v1/completions"]) | st.binary(max_size=30)
wire_versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.1 x", b""])
wire_header_lines = st.lists(st.tuples(st.binary(max_size=12), st.binary(max_size=40)), max_size=5)
