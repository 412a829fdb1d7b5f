"""Property tests: request parsing and prompt rendering never fail with anything but a clean
client error, whatever the bytes (in-process counterparts of tests/integration/test_bad_input_*)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kthena_router.errors import RequestError
from kthena_router.proxy.body import parse_body
from kthena_router.scheduling.request import RequestInfo

PROPS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=15)


@PROPS
@given(raw=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()),
       path=st.sampled_from([CHAT, COMPL, "/v1/embeddings"]))
def test_parse_body_raises_only_request_error(raw: bytes, path: str) -> None:
    try:
        parse_body(raw, path)
    except RequestError as err:
        assert err.status == 400 and err.message


@PROPS
@given(body=st.dictionaries(st.sampled_from(["messages", "prompt", "tools", "model"]), json_values, max_size=4),
       chat=st.booleans())
def test_prompt_rendering_never_raises(body: dict[str, Any], chat: bool) -> None:
    info = RequestInfo("r", CHAT if chat else COMPL, body, "demo", "", "demo")
    out = info.prompt()
    assert out is None or isinstance(out, bytes)


@pytest.mark.parametrize("where", ["tools", "content", "message"])
def test_prompt_rendering_of_deep_nesting_the_parser_accepts(where: str) -> None:
    nest = b"[" * 1000 + b"]" * 1000
    raw = {
        "tools": b'{"messages": [{"role": "user", "content": "x"}], "tools": [' + nest + b"]}",
        "content": b'{"messages": [{"role": "user", "content": [' + nest + b"]}]}",
        "message": b'{"messages": [' + nest + b"]}",
    }[where]
    body = orjson.loads(raw)  # within orjson's depth limit: the router accepts this body
    info = RequestInfo("r", CHAT, body, "demo", "", "demo")
    out = info.prompt()
    assert out is None or isinstance(out, bytes)
