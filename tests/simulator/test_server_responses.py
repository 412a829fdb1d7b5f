"""The simulator's /v1/responses (vLLM-style), against a real process, with the openai SDK."""

from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def sim(sim_factory):
    return sim_factory("--fast", engines=2)


@pytest.fixture(autouse=True)
def _clean(sim):
    sim.reset()
    yield


def _client(sim, i: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url(i) + "/v1", api_key="sk-test", max_retries=0, timeout=30.0)


def test_create_get_and_continue(sim):
    with _client(sim) as c:
        r = c.responses.create(model="demo", input="Hello there")
        assert r.status == "completed" and r.id.startswith("resp_")
        assert r.output_text and r.usage.output_tokens == 16 and r.usage.input_tokens > 0
        got = c.responses.retrieve(r.id)
        assert got.id == r.id and got.output_text == r.output_text
        follow = c.responses.create(model="demo", input="And then?", previous_response_id=r.id)
        assert follow.previous_response_id == r.id
        # the continuation's prompt holds the first turn and its answer: longer than both alone
        assert follow.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens


def test_unknown_id_is_404_on_the_other_engine(sim):
    with _client(sim, 0) as c0, _client(sim, 1) as c1:
        r = c0.responses.create(model="demo", input="Hi")
        with pytest.raises(openai.NotFoundError) as exc:
            c1.responses.create(model="demo", input="more", previous_response_id=r.id)
        assert exc.value.body["param"] == "previous_response_id"
        with pytest.raises(openai.NotFoundError):
            c1.responses.retrieve(r.id)


def test_max_output_tokens_is_incomplete(sim):
    with _client(sim) as c:
        r = c.responses.create(model="demo", input="Hi", max_output_tokens=3)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == 3


@pytest.mark.parametrize("limit,terminal", [(None, "response.completed"), (4, "response.incomplete")])
def test_streamed_events_end_with_terminal_and_no_done(sim, limit, terminal):
    with _client(sim) as c:
        kwargs = {} if limit is None else {"max_output_tokens": limit}
        events = list(c.responses.create(model="demo", input="Hi", stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == terminal
    assert types.count("response.output_text.delta") == (limit or 16)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    raw = httpx.post(sim.url() + "/v1/responses", json={"model": "demo", "input": "Hi", "stream": True},
                     timeout=30.0)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert b"[DONE]" not in raw.content
    assert raw.content.startswith(b"event: response.created\ndata: {")
    # a streamed response is stored too
    with _client(sim) as c:
        assert c.responses.retrieve(final.id).status == final.status


def test_bad_input_is_400(sim):
    r = httpx.post(sim.url() + "/v1/responses", json={"model": "demo", "input": 5}, timeout=30.0)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
