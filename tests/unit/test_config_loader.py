"""Config loader: valid documents, every validation rule, and how errors are named."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

import pytest
from config_fixtures import API, base, dump, endpoints, load, route, server, write

from kthena_router.config import ConfigError, load_config_bytes, load_config_file
from kthena_router.config.duration import parse_duration

REPO = Path(__file__).resolve().parents[2]


def errors_of(tmp_path: Path, docs) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, docs)
    return ei.value


def one_problem(tmp_path: Path, docs) -> ConfigError:
    err = errors_of(tmp_path, docs)
    assert len(err.problems) == 1, str(err)
    return err


# ---------------------------------------------------------------- valid configs


def test_demo_config_loads():
    cfg = load_config_file(REPO / "configs" / "demo.yaml")
    demo = cfg.servers[("default", "demo")]
    assert demo.model == "demo" and demo.inference_engine == "vLLM" and demo.port == 8000
    assert [(e.address, e.port) for e in cfg.endpoints_of(demo)] == [
        ("127.0.0.1", 8001), ("127.0.0.1", 8002), ("127.0.0.1", 8003)]
    lora = [r for r in cfg.routes if r.lora_adapters]
    assert lora and set(lora[0].lora_adapters) == {"demo-lora-a", "demo-lora-b"}
    assert cfg.warnings == ()


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path: Path, monkeypatch):
    monkeypatch.setenv("EXAMPLE_UPSTREAM_TOKEN", "example-token")
    cfg = load_config_file(path)
    assert cfg.routes and cfg.servers


def test_full_schema_is_parsed(tmp_path):
    srv = server(
        "s", "real-model",
        workloadPort={"port": 8443, "protocol": "https"},
        trafficPolicy={"timeout": "1m30s", "retry": {"attempts": 3, "retryInterval": "250ms"}},
    )
    rt = route("r", "m", lora=["a1", "a2"], ts="2025-01-02T03:04:05Z", rules=[{
        "name": "first",
        "modelMatch": {"headers": {"X-User": {"prefix": "beta-"}}, "uri": {"exact": "/v1/completions"},
                       "body": {"model": "m"}},
        "targetModels": [{"modelServerName": "s", "weight": 70}, {"modelServerName": "s", "weight": 30}],
    }])
    rt["spec"]["parentRefs"] = [{"name": "gw", "kind": "Gateway"}]
    cfg = load(tmp_path, [rt, srv, endpoints()])
    s = cfg.servers[("default", "s")]
    assert (s.port, s.protocol, s.timeout_s, s.retry_attempts, s.retry_interval_s) == (8443, "https", 90.0, 3, 0.25)
    assert s.pd_group is None and s.kv_connector is None
    r = cfg.routes[0]
    assert r.creation_timestamp == datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert r.lora_adapters == ("a1", "a2") and r.parent_refs == ({"name": "gw", "kind": "Gateway"},)
    rule = r.rules[0]
    assert set(rule.headers) == {"x-user"} and rule.headers["x-user"].prefix == "beta-"
    assert rule.uri is not None and rule.uri.exact == "/v1/completions" and rule.body_model == "m"
    assert [t.weight for t in rule.targets] == [70, 30]
    assert r.rate_limit is None


def test_defaults(tmp_path):
    cfg = load(tmp_path, base())
    s = cfg.servers[("default", "s")]
    assert (s.port, s.protocol, s.timeout_s, s.retry_attempts, s.retry_interval_s) == (8000, "http", None, None, 0.1)
    assert s.upstream_headers == {} and s.tls_insecure_skip_verify is False and s.kv_connector is None
    assert cfg.routes[0].namespace == "default" and cfg.routes[0].rules[0].targets[0].weight is None


def test_digest_and_source(tmp_path):
    p = write(tmp_path, base())
    cfg = load_config_file(p)
    assert cfg.digest == hashlib.sha256(p.read_bytes()).hexdigest() and cfg.source == str(p)


def test_list_wrapper_empty_documents_and_foreign_kinds(tmp_path):
    lst = {"apiVersion": "v1", "kind": "List", "items": [route(), server()]}
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {}}
    text = "---\n" + dump([lst]) + "---\n---\n" + dump([deploy, endpoints()])
    cfg = load(tmp_path, text)
    assert [r.name for r in cfg.routes] == ["r"] and ("default", "s") in cfg.servers
    assert any("Deployment" in w and "ignored" in w for w in cfg.warnings)


def test_kubectl_output_metadata_is_accepted(tmp_path):
    r = route()
    r["metadata"].update({"uid": "abc", "resourceVersion": "12", "generation": 3, "labels": {"a": "b"},
                          "managedFields": [{"manager": "kubectl"}]})
    r["status"] = {}
    assert load(tmp_path, [r, server(), endpoints()]).routes[0].name == "r"


def test_endpoints_selection_and_port_default(tmp_path):
    eps = endpoints(eps=[
        {"address": "10.0.0.1", "labels": {"app": "s", "role": "decode"}},
        {"address": "engine-b.internal", "port": 9000, "labels": {"app": "s"}},
        {"address": "10.0.0.3", "labels": {"app": "other"}},
        {"address": "10.0.0.1", "labels": {"app": "s"}},  # duplicate of the first after port default
    ])
    other_ns = endpoints("e2", ns="other", eps=[{"address": "10.9.9.9", "labels": {"app": "s"}}])
    cfg = load(tmp_path, [route(), server(workloadPort={"port": 7000}), eps, other_ns])
    got = [(e.address, e.port) for e in cfg.endpoints_of(cfg.servers[("default", "s")])]
    assert got == [("10.0.0.1", 7000), ("engine-b.internal", 9000)]


def test_server_without_endpoints_is_a_warning(tmp_path):
    cfg = load(tmp_path, [route(), server()])
    assert any("no endpoint matches" in w for w in cfg.warnings)


def test_conflicts_are_warnings(tmp_path):
    cfg = load(tmp_path, [route("a"), route("b"), route("c", None, lora=["m"]), server(), endpoints()])
    joined = "\n".join(cfg.warnings)
    assert "tried in this order: default/a, default/b" in joined
    assert "modelName routes win" in joined


# ---------------------------------------------------------------- upstream credentials


def test_token_file_relative_to_config_dir(tmp_path):
    (tmp_path / "token").write_text("s3cr3t\n")
    cfg = load(tmp_path, [route(), server(annotations={
        "router.kthena.io/upstream-token-file": "token",
        "router.kthena.io/tls-insecure-skip-verify": "true"}), endpoints()])
    s = cfg.servers[("default", "s")]
    assert s.upstream_headers == {"Authorization": "Bearer s3cr3t"} and s.tls_insecure_skip_verify
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(cfg)


def test_token_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_TOKEN", "tok")
    cfg = load(tmp_path, [route(), server(annotations={"router.kthena.io/upstream-token-env": "MY_TOKEN"}), endpoints()])
    assert cfg.servers[("default", "s")].upstream_headers == {"Authorization": "Bearer tok"}


@pytest.mark.parametrize("annotations,field,text", [
    ({"router.kthena.io/upstream-token-file": "missing"}, "upstream-token-file", "cannot read token file"),
    ({"router.kthena.io/upstream-token-env": "SURELY_UNSET_VAR_42"}, "upstream-token-env", "not set"),
    ({"router.kthena.io/tls-insecure-skip-verify": "yes"}, "tls-insecure-skip-verify", '"true" or "false"'),
    ({"router.kthena.io/upstream-tokn-file": "x"}, "upstream-tokn-file", "did you mean"),
])
def test_annotation_errors(tmp_path, annotations, field, text):
    err = one_problem(tmp_path, [route(), server(annotations=annotations), endpoints()])
    assert err.field == f'metadata.annotations["router.kthena.io/{field}"]' and text in err.message
    assert err.document == "document 2 (ModelServer default/s)"


# ---------------------------------------------------------------- errors: every rule


def _rule_targets(*targets):
    return [{"targetModels": list(targets)}]


ROUTE_ERRORS = [
    # (route spec changes, field, message fragment)
    ({"modelName": None}, "spec", "modelName or loraAdapters must be set"),
    ({"loraAdapters": [f"a{i}" for i in range(11)]}, "spec.loraAdapters", "at most 10"),
    ({"loraAdapters": ["ok", 5]}, "spec.loraAdapters[1]", "must be a string"),
    ({"rules": []}, "spec.rules", "at least one rule"),
    ({"rules": None}, "spec.rules", "required field is missing"),
    ({"rules": _rule_targets({"modelServerName": "s"}) * 17}, "spec.rules", "at most 16"),
    ({"rules": [{"targetModels": []}]}, "spec.rules[0].targetModels", "1 to 16"),
    ({"rules": _rule_targets(*[{"modelServerName": "s"}] * 17)}, "spec.rules[0].targetModels", "1 to 16"),
    ({"rules": [{"name": "x"}]}, "spec.rules[0].targetModels", "required field is missing"),
    ({"rules": _rule_targets({"modelServerName": "s", "weight": 101})}, "spec.rules[0].targetModels[0].weight",
     "between 0 and 100"),
    ({"rules": _rule_targets({"modelServerName": "s", "weight": -1})}, "spec.rules[0].targetModels[0].weight",
     "between 0 and 100"),
    ({"rules": _rule_targets({"modelServerName": "s", "weight": "50"})}, "spec.rules[0].targetModels[0].weight",
     "must be an integer"),
    ({"rules": _rule_targets({"modelServerName": "s", "weight": 50}, {"modelServerName": "s"})},
     "spec.rules[0].targetModels[1].weight", "all targets of a rule or on none"),
    ({"rules": _rule_targets({"modelServerName": "s", "weight": 0}, {"modelServerName": "s", "weight": 0})},
     "spec.rules[0].targetModels", "all weights are 0"),
    ({"rules": _rule_targets({"modelServerName": "nope"})}, "spec.rules[0].targetModels[0].modelServerName",
     "'nope' not found in namespace 'default'"),
    ({"rules": _rule_targets({"weight": 1})}, "spec.rules[0].targetModels[0]",
     "exactly one of modelServerName or externalModelProviderName must be set"),
    ({"rules": [{"modelMatch": {"headers": {"x-a": {"exact": "a", "prefix": "b"}}},
                 "targetModels": [{"modelServerName": "s"}]}]},
     'spec.rules[0].modelMatch.headers["x-a"]', "exactly one of exact, prefix, regex"),
    ({"rules": [{"modelMatch": {"headers": {"x-a": {}}}, "targetModels": [{"modelServerName": "s"}]}]},
     'spec.rules[0].modelMatch.headers["x-a"]', "exactly one of exact, prefix, regex"),
    ({"rules": [{"modelMatch": {"headers": {"X-A": {"exact": "a"}, "x-a": {"exact": "b"}}},
                 "targetModels": [{"modelServerName": "s"}]}]},
     'spec.rules[0].modelMatch.headers["x-a"]', "duplicate header name"),
    ({"rules": [{"modelMatch": {"uri": {"regex": "(unclosed"}}, "targetModels": [{"modelServerName": "s"}]}]},
     "spec.rules[0].modelMatch.uri.regex", "invalid regular expression"),
    ({"rules": [{"modelMatch": {"uri": {"exact": 1}}, "targetModels": [{"modelServerName": "s"}]}]},
     "spec.rules[0].modelMatch.uri.exact", "must be a string"),
    ({"rules": [{"modelMatch": {"body": {"modle": "x"}}, "targetModels": [{"modelServerName": "s"}]}]},
     "spec.rules[0].modelMatch.body.modle", "did you mean 'model'"),
    ({"rules": [{"modelMatch": {"headerz": {}}, "targetModels": [{"modelServerName": "s"}]}]},
     "spec.rules[0].modelMatch.headerz", "unknown field"),
    ({"modelname": "x"}, "spec.modelname", "did you mean 'modelName'"),
]


@pytest.mark.parametrize("changes,field,fragment", ROUTE_ERRORS, ids=[e[1] + ":" + e[2] for e in ROUTE_ERRORS])
def test_route_errors(tmp_path, changes, field, fragment):
    r = route()
    for k, v in changes.items():
        if v is None:
            r["spec"].pop(k, None)
        else:
            r["spec"][k] = v
    err = one_problem(tmp_path, [r, server(), endpoints()])
    assert (err.field, err.document) == (field, "document 1 (ModelRoute default/r)")
    assert fragment in err.message
    assert err.file.endswith("config.yaml")
    assert str(err) == f"{err.file}: {err.document}: {field}: {err.message}"


SERVER_ERRORS = [
    ({"inferenceEngine": "vllm"}, "spec.inferenceEngine", "must be one of vLLM, SGLang"),
    ({"inferenceEngine": None}, "spec.inferenceEngine", "required"),
    ({"workloadSelector": None}, "spec.workloadSelector", "required"),
    ({"workloadSelector": {"matchLabels": {"app": 1}}}, "spec.workloadSelector.matchLabels.app", "quote it"),
    ({"workloadPort": {"port": 0}}, "spec.workloadPort.port", "between 1 and 65535"),
    ({"workloadPort": {"port": 65536}}, "spec.workloadPort.port", "between 1 and 65535"),
    ({"workloadPort": {"protocol": "http"}}, "spec.workloadPort.port", "required"),
    ({"workloadPort": {"port": 80, "protocol": "grpc"}}, "spec.workloadPort.protocol", "must be one of http, https"),
    ({"trafficPolicy": {"timeout": "30"}}, "spec.trafficPolicy.timeout", "invalid duration"),
    ({"trafficPolicy": {"timeout": 30}}, "spec.trafficPolicy.timeout", "duration string"),
    ({"trafficPolicy": {"timeout": "-1s"}}, "spec.trafficPolicy.timeout", "must not be negative"),
    ({"trafficPolicy": {"retry": {"attempts": -1}}}, "spec.trafficPolicy.retry.attempts", ">= 0"),
    ({"trafficPolicy": {"retry": {"retryInterval": "fast"}}}, "spec.trafficPolicy.retry.retryInterval",
     "invalid duration"),
    ({"trafficPolicy": {"retries": {}}}, "spec.trafficPolicy.retries", "did you mean 'retry'"),
    ({"model": "x" * 257}, "spec.model", "at most 256"),
    ({"modle": "x"}, "spec.modle", "did you mean 'model'"),
]


@pytest.mark.parametrize("changes,field,fragment", SERVER_ERRORS, ids=[e[1] + ":" + e[2] for e in SERVER_ERRORS])
def test_server_errors(tmp_path, changes, field, fragment):
    s = server()
    for k, v in changes.items():
        if v is None:
            s["spec"].pop(k, None)
        else:
            s["spec"][k] = v
    err = one_problem(tmp_path, [route(), s, endpoints()])
    assert (err.field, err.document) == (field, "document 2 (ModelServer default/s)")
    assert fragment in err.message


ENDPOINT_ERRORS = [
    ({"address": "127.0.0.1:8001"}, "spec.endpoints[0].address", "without scheme or port"),
    ({"address": "http://engine"}, "spec.endpoints[0].address", "without scheme or port"),
    ({"address": "10.0.0.300"}, "spec.endpoints[0].address", "IP address or DNS name"),
    ({"address": "10.0.0.1", "port": 70000}, "spec.endpoints[0].port", "between 1 and 65535"),
    ({"port": 80}, "spec.endpoints[0].address", "required"),
    ({"address": "h", "labels": {"v": 1.5}}, "spec.endpoints[0].labels.v", "must be a string"),
    ({"address": "h", "lables": {}}, "spec.endpoints[0].lables", "did you mean 'labels'"),
]


@pytest.mark.parametrize("ep,field,fragment", ENDPOINT_ERRORS, ids=[e[1] + ":" + e[2] for e in ENDPOINT_ERRORS])
def test_endpoint_errors(tmp_path, ep, field, fragment):
    err = one_problem(tmp_path, [route(), server(), endpoints(eps=[ep])])
    assert (err.field, err.document) == (field, "document 3 (Endpoints default/e)")
    assert fragment in err.message


@pytest.mark.parametrize("doc,field,fragment", [
    ({"kind": "ModelRoute", "metadata": {"name": "x"}, "spec": {}}, "apiVersion", "required"),
    ({"apiVersion": API, "metadata": {"name": "x"}}, "kind", "required"),
    ({"apiVersion": API, "kind": "ModelRoutes", "metadata": {"name": "x"}}, "kind", "did you mean ModelRoute"),
    ({"apiVersion": "networking.serving.volcano.sh/v1beta1", "kind": "ModelRoute", "metadata": {"name": "x"}},
     "apiVersion", "must be 'networking.serving.volcano.sh/v1alpha1'"),
    ({"apiVersion": API, "kind": "ModelServer", "spec": {}}, "metadata", "required"),
    ({"apiVersion": API, "kind": "ModelServer", "metadata": {"namespace": "a"}, "spec": {}}, "metadata.name",
     "required"),
    ({"apiVersion": API, "kind": "ModelServer", "metadata": {"name": "q"}}, "spec", "required"),
    ({"apiVersion": API, "kind": "ModelServer", "metadata": {"name": "q"}, "spec": {}, "extra": 1}, "extra",
     "unknown field"),
    ({"apiVersion": API, "kind": "ModelRoute", "metadata": {"name": "q", "creationTimestamp": "yesterday"},
      "spec": {}}, "metadata.creationTimestamp", "RFC 3339"),
    (["not", "a", "mapping"], "", "must be a mapping"),
])
def test_document_errors(tmp_path, doc, field, fragment):
    err = errors_of(tmp_path, base() + [doc])
    assert err.problems[0].document.startswith("document 4"), str(err)
    assert (err.field, fragment in err.message) == (field, True), str(err)


def test_duplicate_objects(tmp_path):
    err = one_problem(tmp_path, base() + [server()])
    assert err.document == "document 4 (ModelServer default/s)" and "first defined in document 2" in err.message


def test_list_items_are_named(tmp_path):
    bad = route()
    bad["spec"]["rules"][0]["targetModels"][0]["weight"] = 500
    err = one_problem(tmp_path, [{"apiVersion": "v1", "kind": "List", "items": [server(), bad]}, endpoints()])
    assert err.document == "document 1, items[1] (ModelRoute default/r)"


def test_target_in_other_namespace_is_not_found(tmp_path):
    err = one_problem(tmp_path, [route(ns="team-a"), server(), endpoints()])
    assert err.field == "spec.rules[0].targetModels[0].modelServerName" and "'team-a'" in err.message


def test_all_problems_are_collected(tmp_path):
    r = route()
    r["spec"]["modelNam"] = "x"
    r["spec"]["rules"][0]["targetModels"][0]["weight"] = 200
    s = server(inferenceEngine="TGI", workloadPort={"port": 0})
    err = errors_of(tmp_path, [r, s, endpoints(eps=[{"address": "a:1"}])])
    fields = [p.field for p in err.problems]
    assert fields == ["spec.modelNam", "spec.rules[0].targetModels[0].weight", "spec.inferenceEngine",
                      "spec.workloadPort.port", "spec.endpoints[0].address"]
    assert len(str(err).splitlines()) == 5


def test_yaml_syntax_error_names_line(tmp_path):
    text = dump(base()) + "---\napiVersion: v1\nkind: a: b\nspec: {}\n"
    err = one_problem(tmp_path, text)
    line = len(dump(base()).splitlines()) + 3
    assert err.document == "document 4" and f"line {line}," in err.message and "YAML syntax error" in err.message


def test_duplicate_yaml_key_is_an_error(tmp_path):
    err = one_problem(tmp_path, "apiVersion: v1\nkind: List\nkind: List\n")
    assert "duplicate key 'kind'" in err.message and "line 3" in err.message


def test_missing_file_and_non_utf8(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config_file(tmp_path / "absent.yaml")
    assert "cannot read file" in ei.value.message and ei.value.file.endswith("absent.yaml")
    with pytest.raises(ConfigError) as ei:
        load_config_bytes(b"\xff\xfe", source="x.yaml")
    assert "not UTF-8" in ei.value.message


@pytest.mark.parametrize("text,seconds", [
    ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5h", 5400.0), ("0", 0.0), ("2us", 2e-6), ("-1s", -1.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "1d", "s", "1m30", "abc"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)
