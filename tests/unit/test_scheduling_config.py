"""routerConfiguration loader: Kthena's shipped configs load; every error names file,
document and field; refused plugins; our defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from kthena_router.config.errors import ConfigError
from kthena_router.session.config import StickySettings
from kthena_router.scheduling.config import (
    DEFAULT_SCORES,
    KvCacheAwareArgs,
    LeastLatencyArgs,
    LeastRequestArgs,
    PrefixCacheArgs,
    ScorePlugin,
    load_router_configuration_bytes,
    load_router_configuration_file,
)

# pkg/kthena-router/scheduler/testdata/configmap.yaml in volcano-sh/kthena
KTHENA_TESTDATA = """\
scheduler:
  pluginConfig:
    - name: least-request
      args:
        maxWaitingRequests: 10
    - name: least-latency
      args:
        TTFTTPOTWeightFactor: 0.5
    - name: prefix-cache
      args:
        blockSizeToHash: 64
        maxBlocksToMatch: 128
        maxHashCacheSize: 50000
        topKMatches: 5
  plugins:
    Filter:
      enabled:
        - least-request
      disabled:
        - lora-affinity
    Score:
      enabled:
        - name: least-request
          weight: 1
        - name: gpu-usage
          weight: 1
        - name: least-latency
          weight: 1
        - name: prefix-cache
          weight: 1
"""

# The Helm chart's ConfigMap (charts/kthena/charts/networking/.../configmap.yaml), rendered.
KTHENA_CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: kthena-router-config
  namespace: kthena-system
  labels:
    app.kubernetes.io/component: kthena-router
data:
  routerConfiguration: |-
""" + "".join("    " + line + "\n" for line in KTHENA_TESTDATA.splitlines()) + """\
    sessionSticky:
      backend: "memory"
"""

WITH_KV = """\
scheduler:
  pluginConfig:
  - name: kvcache-aware
    args: {blockSizeToHash: 16, maxBlocksToMatch: 256, vllmTokenizerPort: 8000,
           tokenizers: {demo: tok/tokenizer.json, other: /abs/dir}}
  plugins:
    Filter: {enabled: [lora-affinity]}
    Score:
      enabled:
      - {name: kvcache-aware, weight: 2}
      - {name: least-request, weight: 0.5}
"""


def load(text: str, tmp_path: Path, name: str = "router.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return load_router_configuration_file(p)


def error(text: str, tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load(text, tmp_path)
    return ei.value


def test_kthena_testdata_loads(tmp_path):
    cfg = load(KTHENA_TESTDATA, tmp_path)
    s = cfg.scheduler
    assert s.filters == ("least-request",)
    assert s.scores == (ScorePlugin("least-request", 1), ScorePlugin("gpu-usage", 1),
                        ScorePlugin("least-latency", 1), ScorePlugin("prefix-cache", 1))
    assert s.args["prefix-cache"] == PrefixCacheArgs(64, 128, 50000, 5)
    assert s.args["least-request"] == LeastRequestArgs(10)
    assert s.args["least-latency"] == LeastLatencyArgs(0.5)
    assert s.filters_disabled == ("lora-affinity",)
    assert s.scorer_args()["prefix-cache"] == {"blockSizeToHash": 64, "maxBlocksToMatch": 128,
                                               "maxHashCacheSize": 50000, "topKMatches": 5,
                                               # ours, at its default
                                               "evictedHintSlots": PrefixCacheArgs().evicted_hint_slots,
                                               "balanceMisses": False}
    assert cfg.warnings == () and cfg.auth is None


def test_kthena_configmap_manifest_loads_the_same(tmp_path):
    plain = load(KTHENA_TESTDATA, tmp_path, "plain.yaml")
    cm = load(KTHENA_CONFIGMAP, tmp_path, "cm.yaml")
    assert cm.scheduler == plain.scheduler
    assert cm.session_sticky == StickySettings(backend="memory")


def test_configmap_among_other_documents(tmp_path):
    text = "kind: Service\napiVersion: v1\nmetadata: {name: x}\n---\n" + KTHENA_CONFIGMAP
    assert load(text, tmp_path).scheduler.filters == ("least-request",)


def test_kvcache_args(tmp_path):
    cfg = load(WITH_KV, tmp_path)
    assert cfg.auth is None
    kv = cfg.scheduler.args["kvcache-aware"]
    assert isinstance(kv, KvCacheAwareArgs)
    assert (kv.block_size_to_hash, kv.max_blocks_to_match, kv.vllm_tokenizer_port) == (16, 256, 8000)
    assert kv.tokenizers["demo"] == str(tmp_path / "tok" / "tokenizer.json")
    assert kv.tokenizers["other"] == "/abs/dir"
    assert cfg.scheduler.scores == (ScorePlugin("kvcache-aware", 2), ScorePlugin("least-request", 0.5))
    assert "tokenizers" not in cfg.scheduler.scorer_args()["kvcache-aware"]


def test_defaults(tmp_path):
    for text in ("", "scheduler: {}\n", "auth: null\n"):
        s = load(text, tmp_path).scheduler
        assert s.filters == ("least-request",) and s.scores == DEFAULT_SCORES
        assert s.args["prefix-cache"] == PrefixCacheArgs()
        assert s.args["prefix-cache"].max_hash_cache_size is None  # follows engine KV capacity
        assert s.args["kvcache-aware"].block_size_to_hash == 16


@pytest.mark.parametrize(("text", "field", "words"), [
    ("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: session-affinity, weight: 1}\n",
     "scheduler.plugins.Score.enabled[0].name", "refused"),
    ("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: cost-aware, weight: 1}\n",
     "scheduler.plugins.Score.enabled[0].name", "refused"),
    ("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cach, weight: 1}\n",
     "scheduler.plugins.Score.enabled[0].name", "did you mean 'prefix-cache'"),
    ("scheduler:\n  plugins:\n    Filter: {enabled: [gpu-usage]}\n",
     "scheduler.plugins.Filter.enabled[0]", "not a filter plugin"),
    ("scheduler:\n  plugins:\n    Filter: {enabled: [least-request, least-request]}\n",
     "scheduler.plugins.Filter.enabled[1]", "duplicate"),
    ("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: gpu-usage, weight: -1}\n",
     "scheduler.plugins.Score.enabled[0].weight", ">= 0"),
    ("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: gpu-usage, weight: one}\n",
     "scheduler.plugins.Score.enabled[0].weight", "number"),
    ("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: gpu-usage}\n      - {name: gpu-usage}\n",
     "scheduler.plugins.Score.enabled[1].name", "duplicate"),
    ("scheduler:\n  pluginConfig:\n  - {name: least-latency, args: {TTFTTPOTWeightFactor: 1.5}}\n",
     "scheduler.pluginConfig[0].args.TTFTTPOTWeightFactor", "between 0 and 1"),
    ("scheduler:\n  pluginConfig:\n  - {name: least-latency, args: {TTFTTPOTWeightFactor: .nan}}\n",
     "scheduler.pluginConfig[0].args.TTFTTPOTWeightFactor", "between 0 and 1"),
    ("scheduler:\n  pluginConfig:\n  - {name: prefix-cache, args: {blockSizeToHash: \"64\"}}\n",
     "scheduler.pluginConfig[0].args.blockSizeToHash", "integer"),
    ("scheduler:\n  pluginConfig:\n  - {name: prefix-cache}\n  - {name: prefix-cache}\n",
     "scheduler.pluginConfig[1].name", "duplicate"),
    ("scheduler:\n  pluginConfig:\n  - {name: nope}\n", "scheduler.pluginConfig[0].name", "unknown plugin"),
    ("scheduler:\n  pluginConfig:\n  - {args: {}}\n", "scheduler.pluginConfig[0].name", "non-empty string"),
    ("scheduler:\n  pluginConfig:\n  - {name: kvcache-aware, args: {tokenizers: [a]}}\n",
     "scheduler.pluginConfig[0].args.tokenizers", "mapping"),
    ("scheduler:\n  pluginConfig: {name: x}\n", "scheduler.pluginConfig", "list"),
    ("scheduler: [1]\n", "scheduler", "mapping"),
    ("auth: {audiences: [1]}\n", "auth.audiences[0]", "string"),
    ("sessionSticky: memory\n", "sessionSticky", "mapping"),
    ("auth: {issuer: https://issuer.example}\n", "auth", "no credential source"),
    ("auth: {audiences: [kthena]}\n", "auth", "no credential source"),
    ("auth: {jwksUri: ftp://issuer.example/jwks}\n", "auth.jwksUri", "http(s) URL"),
    ("auth: {jwksUri: https://i.example/jwks, algorithms: [HS256]}\n", "auth.algorithms[0]", "HMAC"),
    ("auth: {apiKeysFile: absent.yaml}\n", "auth.apiKeysFile", "cannot read file"),
    ("sessionSticky: {backend: redis}\n", "sessionSticky.redis", "required with backend: redis"),
    ("sessionSticky: {backend: etcd}\n", "sessionSticky.backend", "must be one of memory, redis"),
])
def test_errors_name_file_document_and_field(tmp_path, text, field, words):
    err = error(text, tmp_path)
    assert err.file == str(tmp_path / "router.yaml")
    assert err.document == "document 1"
    assert err.field == field
    assert words in err.message
    assert str(tmp_path / "router.yaml") in str(err) and field in str(err)


def test_error_inside_configmap_names_the_configmap(tmp_path):
    text = KTHENA_CONFIGMAP.replace("weight: 1\n", "weight: -3\n", 1)
    err = error(text, tmp_path)
    assert err.document == "document 1 (ConfigMap kthena-system/kthena-router-config) data.routerConfiguration"
    assert err.field == "scheduler.plugins.Score.enabled[0].weight"


def test_all_problems_are_reported(tmp_path):
    text = ("scheduler:\n  plugins:\n    Filter: {enabled: [cost-aware]}\n    Score:\n      enabled:\n"
            "      - {name: session-affinity, weight: 1}\n      - {name: random, weight: -1}\n")
    err = error(text, tmp_path)
    assert [p.field for p in err.problems] == [
        "scheduler.plugins.Filter.enabled[0]", "scheduler.plugins.Score.enabled[0].name",
        "scheduler.plugins.Score.enabled[1].weight"]


def test_yaml_errors(tmp_path):
    err = error("scheduler: {plugins: [}\n", tmp_path)
    assert err.document == "document 1" and "YAML syntax error" in err.message
    err = error("scheduler: {}\nscheduler: {}\n", tmp_path)
    assert "duplicate key" in err.message
    err = error("scheduler: {}\n---\nauth: {}\n", tmp_path)
    assert err.document == "document 2"
    err = error("kind: ConfigMap\ndata: {other: x}\n", tmp_path)
    assert err.field == "data" and "routerConfiguration" in err.message


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_router_configuration_file(tmp_path / "absent.yaml")


def test_warnings_not_errors(tmp_path):
    text = ("scheduler:\n  pluginConfig:\n"
            "  - {name: session-affinity, args: {headerName: X-S}}\n"
            "  plugins:\n    Score:\n      enabled:\n      - {name: random, weight: 1}\n"
            "      - {name: gpu-usage}\n")
    cfg = load(text, tmp_path)
    assert cfg.scheduler.scores == (ScorePlugin("gpu-usage", 1.0),)  # random dropped; weight 1
    joined = "\n".join(cfg.warnings)
    for needle in ("session-affinity", "'random' is dropped", "enabled[1].weight"):
        assert needle in joined


@pytest.mark.parametrize("plugin, arg", [("prefix-cache", "blockSizeToHash"),
                                         ("prefix-hash-bounded", "prefixKeyBlocks"),
                                         ("prefix-hash-bounded", "blockSizeToHash")])
def test_out_of_range_integer_is_refused_not_replaced(tmp_path, plugin, arg):
    # Kthena silently uses the default here; a value that is then ignored is refused instead.
    text = f"scheduler:\n  pluginConfig:\n  - {{name: {plugin}, args: {{{arg}: 0}}}}\n"
    with pytest.raises(ConfigError) as exc:
        load(text, tmp_path)
    [p] = exc.value.problems
    assert p.field == f"scheduler.pluginConfig[0].args.{arg}" and ">= 1" in p.message, str(exc.value)


@pytest.mark.parametrize("text, field", [
    ("scheduler:\n  pluginConfig:\n  - {name: prefix-cache, args: {futureArg: 1}}\n",
     "scheduler.pluginConfig[0].args.futureArg"),
    ("newTopLevel: {}\n", "newTopLevel"),
    ("scheduler:\n  plugins: {Score: {enabeld: []}}\n", "scheduler.plugins.Score.enabeld"),
])
def test_unknown_fields_are_refused_not_ignored(tmp_path, text, field):
    with pytest.raises(ConfigError) as exc:
        load(text, tmp_path)
    assert any(p.field == field and "unknown field" in p.message for p in exc.value.problems), str(exc.value)


def test_digest_and_bytes_entry():
    a = load_router_configuration_bytes(KTHENA_TESTDATA, source="x")
    b = load_router_configuration_bytes(KTHENA_TESTDATA.encode(), source="x")
    assert a.digest == b.digest and len(a.digest) == 64 and a.source == "x"


def test_model_is_frozen(tmp_path):
    cfg = load(KTHENA_TESTDATA, tmp_path)
    with pytest.raises(AttributeError):
        cfg.scheduler.filters = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.scheduler.args["x"] = None  # type: ignore[index]


def test_kthena_auth_section_loads_and_is_enforced(tmp_path):
    cfg = load("auth: {issuer: https://issuer.example, audiences: [kthena], jwksUri: https://i.example/jwks}\n",
               tmp_path)
    assert cfg.auth is not None and cfg.auth.jwt
    assert (cfg.auth.issuer, cfg.auth.audiences, cfg.auth.jwks_uri) == \
        ("https://issuer.example", ("kthena",), "https://i.example/jwks")
    assert cfg.auth.algorithms == ("RS256", "ES256", "EdDSA") and cfg.auth.user_claim == "sub"


def test_empty_auth_placeholder_and_memory_store_load(tmp_path):
    for text in ("auth: {}\n", "auth: {issuer: '', audiences: [], jwksUri: ''}\n",
                 "sessionSticky: {}\n", "sessionSticky: {backend: memory}\n"):
        cfg = load(text, tmp_path)
        assert cfg.auth is None
        assert cfg.session_sticky is None or cfg.session_sticky == StickySettings()
