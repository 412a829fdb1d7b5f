"""The simulator's OpenAI/vLLM wire API, against a real process (fast and physics mode)."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from loadtest.simulator.tokenizer import TOKENIZER_PATH, load_codec, render_chat


@pytest.fixture(scope="module", params=["fast", "engine"])
def sim(request, sim_factory):
    extra = ["--fast"] if request.param == "fast" else ["--time-scale", "0.05"]
    s = sim_factory(*extra, "--lora", "ad1", "--max-loras", "2", engines=2)
    yield s


@pytest.fixture(autouse=True)
def _clean(sim):
    sim.reset()
    yield


@pytest.fixture
def client(sim):
    with openai.OpenAI(base_url=sim.url(0) + "/v1", api_key="sk-test", max_retries=0,
                       timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def codec():
    return load_codec()


def test_chat_non_streaming(client, sim, codec):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model="demo", messages=msgs, max_tokens=7)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion" and r.model == "demo" and r.created > 0
    assert r.choices[0].index == 0 and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens == len(codec.encode(render_chat(msgs)))
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_default_max_tokens_is_16_and_max_completion_tokens_wins(client):
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}])
    assert r.usage.completion_tokens == 16
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=50, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3


def test_chat_streaming_with_usage(client, sim):
    stream = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.id == chunks[0].id and c.id.startswith("chatcmpl-") for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 5
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 5


def test_raw_sse_framing_and_done(sim):
    body = {"model": "demo", "prompt": "Once upon", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", sim.url(0) + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [ln for ln in r.iter_lines() if ln]
    assert events[-1] == "data: [DONE]"
    objs = [orjson.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(o["id"].startswith("cmpl-") and o["object"] == "text_completion" for o in objs)
    assert [o["choices"][0]["finish_reason"] for o in objs] == [None, None, None, "length"]
    assert all("usage" not in o for o in objs)  # not asked for


def test_completion_prompt_forms(client, codec):
    r = client.completions.create(model="demo", prompt="The quick brown fox", max_tokens=3)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    # like vLLM with a Llama-3 tokenizer: BOS + the text's tokens
    assert r.usage.prompt_tokens == len(codec.encode("The quick brown fox")) + 1
    r = client.completions.create(model="demo", prompt=[5, 6, 7, 8, 9], max_tokens=2)
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 2
    r = client.completions.create(model="demo", prompt=["first one", "second"], max_tokens=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 4
    r = client.completions.create(model="demo", prompt=[[1, 2, 3], [4, 5]], max_tokens=1)
    assert r.usage.prompt_tokens == 5 and len(r.choices) == 2


def test_completion_streaming_multi_prompt_with_usage(client):
    chunks = list(client.completions.create(model="demo", prompt=["a b", "c d"], max_tokens=3,
                                            stream=True, stream_options={"include_usage": True}))
    per_index = {0: 0, 1: 0}
    for c in chunks:
        for ch in c.choices:
            per_index[ch.index] += 1
    assert per_index == {0: 3, 1: 3}
    assert chunks[-1].usage.completion_tokens == 6


def test_models_and_lora_bounds(sim, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["demo", "ad1"]
    base = sim.url(0)
    r = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "ad2", "lora_path": "/x"})
    assert r.status_code == 200
    r = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "ad3", "lora_path": "/y"})
    assert r.status_code == 400 and "max_loras" in r.json()["error"]["message"]
    r = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "ad2", "lora_path": "/x"})
    assert r.status_code == 400  # already loaded
    models = httpx.get(base + "/v1/models").json()["data"]
    assert {m["id"]: m["parent"] for m in models} == {"demo": None, "ad1": "demo", "ad2": "demo"}
    out = client.chat.completions.create(model="ad2", messages=[{"role": "user", "content": "x"}],
                                         max_tokens=2)
    assert out.model == "ad2"
    assert sim.requests(0)["log"][-1]["model"] == "ad2"
    assert httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "ad2"}).status_code == 200
    r = httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "ad2"})
    assert r.status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="ad2", messages=[{"role": "user", "content": "x"}])
    # the other engine has its own adapters
    assert [m["id"] for m in httpx.get(sim.url(1) + "/v1/models").json()["data"]] == ["demo", "ad1"]


def test_unknown_model_is_vllm_404(sim):
    r = httpx.post(sim.url(0) + "/v1/chat/completions",
                   json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "The model `nope` does not exist.",
                                  "type": "NotFoundError", "param": "model", "code": 404}}
    log = sim.requests(0)
    assert log["rejected"] == 1 and log["log"][0]["model"] == "nope"


@pytest.mark.parametrize("raw,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"model": "demo", "messages": "hi"}', "messages"),
    (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "n": 2}', "n"),
    (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
     "max_tokens"),
    (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": "3"}',
     "max_tokens"),
    (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], '
     b'"stream_options": {"include_usage": true}}', "stream_options"),
    (b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
])
def test_bad_requests_get_openai_400(sim, raw, param):
    r = httpx.post(sim.url(0) + "/v1/chat/completions", content=raw,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == param
    assert err["message"] and "Traceback" not in r.text


def test_bad_completion_prompts(sim):
    for prompt in ("", [], [1, "a"], [-1], None, {"a": 1}):
        r = httpx.post(sim.url(0) + "/v1/completions", json={"model": "demo", "prompt": prompt})
        assert r.status_code == 400, prompt
        assert r.json()["error"]["param"] == "prompt"


def test_too_long_prompt_is_400(sim_factory):
    s = sim_factory("--fast", "--max-model-len", "64")
    r = httpx.post(s.url(0) + "/v1/completions",
                   json={"model": "demo", "prompt": list(range(60)), "max_tokens": 10})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]


def test_headers_and_request_id_recorded(sim, client):
    client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}],
                                   max_tokens=1, extra_headers={"X-Request-ID": "req-42"})
    entry = sim.requests(0)["log"][-1]
    assert entry["request_id"] == "req-42" and entry["status"] == "completed"
    assert entry["headers"]["authorization"] == "Bearer sk-test"
    assert entry["path"] == "/v1/chat/completions" and entry["tokens_out"] == 1
    httpx.post(sim.url(0) + "/v1/completions", json={"model": "demo", "prompt": "x"})
    log = sim.requests(0)
    assert "authorization" not in log["log"][-1]["headers"]
    assert log["log"][-1]["request_id"] is None
    assert log["received"] == 2 and log["completed"] == 2


def test_health_and_probe_endpoints(sim):
    base = sim.url(0)
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/health_generate").status_code == 200
    info = httpx.get(base + "/get_server_info").json()
    assert info["served_model_name"] == "demo" and info["page_size"] == 16
    assert httpx.get(base + "/server_info").status_code == 200
    mi = httpx.get(base + "/get_model_info").json()
    assert mi["model_path"] == "demo" and mi["is_generation"] is True
    load = httpx.get(base + "/get_load").json()
    assert load["load"] == 0 and isinstance(load["ranks"], list)
    assert httpx.get(base + "/load").json()["load"] == 0
    assert httpx.post(base + "/flush_cache").status_code == 200
    r = httpx.get(base + "/no/such/path")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_tokenize_and_render_match_usage(sim, client, codec):
    base = sim.url(0)
    msgs = [{"role": "user", "content": "Tell me about the cache"}]
    tok = httpx.post(base + "/tokenize", json={"model": "demo", "prompt": "hello world",
                                               "return_token_strs": True}).json()
    assert tok["tokens"] == codec.encode("hello world", add_special_tokens=True)
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 131072
    assert len(tok["token_strs"]) == tok["count"]
    chat_tok = httpx.post(base + "/tokenize", json={"model": "demo", "messages": msgs}).json()
    rendered = httpx.post(base + "/v1/chat/completions/render",
                          json={"model": "demo", "messages": msgs}).json()
    assert rendered["token_ids"] == chat_tok["tokens"]
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == "demo"
    usage = client.chat.completions.create(model="demo", messages=msgs, max_tokens=1).usage
    assert usage.prompt_tokens == len(rendered["token_ids"])
    comp = httpx.post(base + "/v1/completions/render",
                      json={"model": "demo", "prompt": ["a", "b c"]}).json()
    assert [len(c["token_ids"]) for c in comp] == [len(codec.encode(p, True)) for p in ("a", "b c")]
    detok = httpx.post(base + "/detokenize", json={"model": "demo", "tokens": chat_tok["tokens"]})
    assert detok.json()["prompt"] == render_chat(msgs)
    r = httpx.post(base + "/tokenize", json={"model": "zzz", "prompt": "x"})
    assert r.status_code == 404


def test_shipped_tokenizer_is_standard_and_small():
    from tokenizers import Tokenizer

    assert TOKENIZER_PATH.stat().st_size < 2_000_000
    tok = Tokenizer.from_file(str(TOKENIZER_PATH))
    assert tok.get_vocab_size() >= 30000
    text = "The router sends every request to the engine with the best cache."
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text.split()) * 2  # merges, not bytes


def test_admin_engine_list(sim):
    engines = sim.admin.get("/admin/engines").json()
    assert [e["index"] for e in engines] == [0, 1]
    assert [e["port"] for e in engines] == sim.ports
