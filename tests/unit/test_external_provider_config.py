"""ExternalModelProvider and Secret documents, route targets naming providers, the router
configuration's externalProviders section, the base-URL path join, Anthropic SSE ends."""

from __future__ import annotations

import base64
import random
from pathlib import Path
from typing import Any

import pytest
from config_fixtures import API, load, route

from kthena_router.config import ConfigError
from kthena_router.config.external_provider import upstream_path
from kthena_router.proxy.sse import SseRelay, StreamEnd
from kthena_router.routing.table import ExternalMatch, RouteMatch, RouteTable
from kthena_router.scheduling.config import load_router_configuration_bytes

KEY = "sk-unit-secret"
LABELS = {"networking.serving.volcano.sh/external-model-provider-credential": "true"}


def provider(name: str = "p", base_url: str = "https://api.example.com/v1", **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if "annotations" in spec:
        meta["annotations"] = spec.pop("annotations")
    return {"apiVersion": API, "kind": "ExternalModelProvider", "metadata": meta,
            "spec": {"baseURL": base_url, **spec}}


def secret(name: str = "k", labels: dict[str, str] | None = LABELS, **fields: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    if not fields:
        fields = {"data": {"api-key": base64.b64encode(KEY.encode()).decode()}}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, **fields}


def ext_route(target: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return route(rules=[{"targetModels": [target]}], **kw)


AUTH = {"secretRef": {"name": "k", "key": "api-key"}}


def problems(tmp_path: Path, docs: list[dict[str, Any]]) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, docs)
    text = [str(p) for p in ei.value.problems]
    assert not any(KEY in t for t in text)
    return text


def test_provider_with_secret_resolves_and_hides_the_key(tmp_path: Path) -> None:
    cfg = load(tmp_path, [ext_route({"externalModelProviderName": "p"}), provider(auth=AUTH, model="up"), secret()])
    p = cfg.providers[("default", "p")]
    assert (p.provider_type, p.auth_scheme, p.credential, p.model) == ("OpenAI", "Bearer", KEY, "up")
    assert KEY not in repr(cfg) and KEY not in repr(p)
    m = RouteTable.build(cfg).match("m", "/v1/chat/completions", {}, random.Random(0))
    assert type(m) is ExternalMatch and m.provider is p and m.upstream_model == "up"


def test_anthropic_default_scheme_string_data_and_credential_file(tmp_path: Path) -> None:
    cfg = load(tmp_path, [ext_route({"externalModelProviderName": "p"}),
                          provider(providerType="Anthropic", auth=AUTH),
                          secret(stringData={"api-key": f"  {KEY}\n"})])
    p = cfg.providers[("default", "p")]
    assert (p.auth_scheme, p.credential, p.auth_header()) == ("APIKey", KEY, (b"x-api-key", KEY.encode()))
    (tmp_path / "key.txt").write_text("file-key\n")
    cfg = load(tmp_path, [ext_route({"externalModelProviderName": "p"}),
                          provider(annotations={"router.kthena.io/credential-file": "key.txt"})])
    p = cfg.providers[("default", "p")]
    assert (p.auth_scheme, p.credential) == ("Bearer", "file-key")


def test_credential_problems_name_file_document_and_field(tmp_path: Path) -> None:
    r = ext_route({"externalModelProviderName": "p"})
    [msg] = problems(tmp_path, [r, provider(auth=AUTH)])
    assert "document 2 (ExternalModelProvider default/p): spec.auth.secretRef.name: Secret 'k' not found" in msg
    assert "CredentialsResolved=False" in msg
    [msg] = problems(tmp_path, [r, provider(auth=AUTH), secret(labels=None)])
    assert "does not have the label networking.serving.volcano.sh/external-model-provider-credential" in msg
    [msg] = problems(tmp_path, [r, provider(auth={"secretRef": {"name": "k", "key": "other"}}), secret()])
    assert "spec.auth.secretRef.key: key 'other' not found" in msg
    [msg] = problems(tmp_path, [r, provider(annotations={"router.kthena.io/credential-file": "missing.txt"})])
    assert "metadata.annotations[\"router.kthena.io/credential-file\"]: cannot read credential file" in msg
    msgs = problems(tmp_path, [r, provider(auth=AUTH), secret(data={"api-key": "%%%"})])
    assert any('document 3 (Secret default/k): data["api-key"]: not valid base64' in m for m in msgs)


@pytest.mark.parametrize(("target", "fragment"), [
    ({"externalModelProviderName": "nope"}, "targetModels[0].externalModelProviderName: ExternalModelProvider "
                                            "'nope' not found"),
    ({"externalModelProviderName": "p", "modelServerName": "s"}, "exactly one of modelServerName or "
                                                                 "externalModelProviderName"),
    ({"weight": 10}, "exactly one of modelServerName or externalModelProviderName"),
])
def test_route_targets(tmp_path: Path, target: dict[str, Any], fragment: str) -> None:
    msgs = problems(tmp_path, [ext_route(target), provider()])
    assert any(fragment in m for m in msgs), msgs


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"baseURL": "http://api.example.com"}, "spec.baseURL: must be an https:// URL"),
    ({"baseURL": "https://u:p@api.example.com"}, "must not contain userinfo"),
    ({"headers": {"Authorization": "x"}}, 'spec.headers.Authorization: reserved header'),
    ({"providerType": "Gemini"}, "spec.providerType"),
    ({"auth": {"scheme": "Basic", "secretRef": {"name": "k", "key": "api-key"}}}, "spec.auth.scheme"),
    ({"auth": {"secretRef": {"name": "k", "key": "api-key", "optional": True}}}, "optional must be false"),
    ({"unknown": 1}, "spec.unknown: unknown field"),
])
def test_provider_spec_rules(tmp_path: Path, spec: dict[str, Any], fragment: str) -> None:
    msgs = problems(tmp_path, [ext_route({"externalModelProviderName": "p"}), provider(**spec), secret()])
    assert any(fragment in m for m in msgs), msgs


def test_split_between_server_and_provider(tmp_path: Path) -> None:
    from config_fixtures import endpoints, server
    cfg = load(tmp_path, [route(rules=[{"targetModels": [{"modelServerName": "s", "weight": 50},
                                                          {"externalModelProviderName": "p", "weight": 50}]}]),
                          server(), endpoints(), provider()])
    table = RouteTable.build(cfg)
    rng = random.Random(3)
    kinds = {type(table.match("m", "/v1/completions", {}, rng)) for _ in range(50)}
    assert kinds == {RouteMatch, ExternalMatch}
    assert cfg.providers[("default", "p")].auth_scheme is None  # no spec.auth: no credential


def test_upstream_path_joins_as_kthena(tmp_path: Path) -> None:
    def path(base: str, ptype: str, p: str) -> str:
        cfg = load(tmp_path, [ext_route({"externalModelProviderName": "p"}), provider(base_url=base, providerType=ptype)])
        return upstream_path(cfg.providers[("default", "p")], p)

    assert path("https://api.deepseek.com", "OpenAI", "/v1/chat/completions") == "/v1/chat/completions"
    assert path("https://api.example.com/v1/", "OpenAI", "/v1/responses") == "/v1/responses"
    assert path("https://h/openai", "OpenAI", "/v1/completions") == "/openai/completions"
    assert path("https://h", "Anthropic", "/v1/messages") == "/v1/messages"
    assert path("https://h/anthropic", "Anthropic", "/v1/messages") == "/anthropic/v1/messages"
    assert path("https://h/anthropic/v1", "Anthropic", "/v1/messages") == "/anthropic/v1/messages"


def test_router_configuration_section(tmp_path: Path) -> None:
    rc = load_router_configuration_bytes(
        "externalProviders:\n  retry: {attempts: 1}\n  timeouts: {idle: 5m}\n"
        "  providers:\n    p: {timeouts: {response: 2s}}\n", "rc.yaml", tmp_path)
    ps = rc.external_providers.for_provider("default", "p")
    assert (ps.retry_attempts, dict(ps.timeouts)) == (1, {"idle_s": 300.0, "response_s": 2.0})
    assert rc.external_providers.for_provider("default", "other").timeouts == (("idle_s", 300.0),)
    with pytest.raises(ConfigError) as ei:
        load_router_configuration_bytes("externalProviders:\n  caFle: x\n", "rc.yaml", tmp_path)
    assert "rc.yaml: document 1: externalProviders.caFle: unknown field (did you mean 'caFile'?)" in str(ei.value)
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ConfigError) as ei:
        load_router_configuration_bytes("externalProviders:\n  providers:\n    p: {caFile: bad.pem}\n",
                                        "rc.yaml", tmp_path)
    assert "externalProviders.providers.p.caFile" in str(ei.value)


def test_anthropic_stream_end_and_usage() -> None:
    relay = SseRelay(hide_usage=False, end=StreamEnd.MESSAGES)
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":7,'
             b'"cache_read_input_tokens":2,"output_tokens":1}}}\n\n')
    assert relay.feed(start) == start and not relay.ended
    relay.feed(b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"message_stop"}}\n\n')
    assert not relay.ended  # a text that names the event does not end the stream
    relay.feed(b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":3}}\n\n')
    assert not relay.clean_eof()
    relay.feed(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert relay.ended and relay.usage == {"prompt_tokens": 9, "completion_tokens": 3}
