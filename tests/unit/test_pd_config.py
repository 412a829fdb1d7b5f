"""The router configuration's `pd` section: fields, defaults, per-server overrides, and
every mistake named by file, document and field (the scheduler parser's paths under pd.*)."""

from __future__ import annotations

import dataclasses

import pytest

from kthena_router.config.errors import ConfigError
from kthena_router.pd.config import DEFAULT_PD, PdServerSettings, PdSettings
from kthena_router.pd.config_parse import side_settings
from kthena_router.pd.pairing import PdPairer
from kthena_router.scheduling.check import validate_router_configuration
from kthena_router.scheduling.config import ScorePlugin, load_router_configuration_bytes


def load(text: str):
    return load_router_configuration_bytes(text.encode(), source="rc.yaml")


def problems(text: str) -> list[tuple[str, str, str, str]]:
    with pytest.raises(ConfigError) as ei:
        load(text)
    return [(p.file, p.document, p.field, p.message) for p in ei.value.problems]


def test_absent_section_is_the_default_pipelines() -> None:
    pd = load("scheduler: {}\n").pd
    assert pd is DEFAULT_PD
    assert pd.for_server("default", "x") == PdServerSettings(60.0, 0)
    d, p = side_settings(pd, "decode"), side_settings(pd, "prefill")
    assert d.filters == ("least-request",) and d.scores == (ScorePlugin("least-request", 1), ScorePlugin("gpu-usage", 1))
    assert p.filters == ("least-request",) and p.scores == (ScorePlugin("prefix-cache", 1), ScorePlugin("least-request", 1))


def test_empty_section_has_the_same_defaults() -> None:
    pd = load("pd: {}\n").pd
    assert side_settings(pd, "decode") == side_settings(DEFAULT_PD, "decode")
    assert side_settings(pd, "prefill") == side_settings(DEFAULT_PD, "prefill")
    assert pd.defaults == PdServerSettings(60.0, 0) and dict(pd.servers) == {}


def test_every_field() -> None:
    pd = load("""
pd:
  decode:
    plugins:
      Score: {enabled: [{name: least-request, weight: 2}, {name: prefix-cache, weight: 1}]}
    pluginConfig:
    - {name: prefix-cache, args: {blockSizeToHash: 32}}
  prefill:
    plugins:
      Filter: {enabled: []}
      Score: {enabled: [{name: prefix-cache, weight: 3}]}
  prefillTimeout: 90s
  minUncachedTokens: 256
  servers:
    llama-pd: {minUncachedTokens: 512}
    team/other: {prefillTimeout: 1m30s}
    team/zero: {minUncachedTokens: 0, prefillTimeout: 500ms}
""").pd
    assert pd.decode is not None and pd.decode.scores == (ScorePlugin("least-request", 2), ScorePlugin("prefix-cache", 1))
    assert pd.decode.args["prefix-cache"].block_size_to_hash == 32
    assert pd.prefill is not None and pd.prefill.filters == () and pd.prefill.scores == (ScorePlugin("prefix-cache", 3),)
    assert pd.defaults == PdServerSettings(90.0, 256)
    assert pd.for_server("default", "llama-pd") == PdServerSettings(90.0, 512)  # unset fields inherit
    assert pd.for_server("team", "other") == PdServerSettings(90.0, 256)
    assert pd.for_server("team", "zero") == PdServerSettings(0.5, 0)
    assert pd.for_server("team", "llama-pd") == pd.defaults  # "name" means the default namespace


def test_a_side_without_plugins_keeps_its_default_but_takes_plugin_config() -> None:
    pd = load("pd: {prefill: {pluginConfig: [{name: prefix-cache, args: {blockSizeToHash: 128}}]}}\n").pd
    assert pd.prefill is not None and pd.prefill.scores == side_settings(DEFAULT_PD, "prefill").scores
    assert pd.prefill.args["prefix-cache"].block_size_to_hash == 128


@pytest.mark.parametrize("text,field,fragment", [
    ("pd: {prefilTimeout: 5s}", "pd.prefilTimeout", "did you mean 'prefillTimeout'"),
    ("pd: []", "pd", "must be a mapping"),
    ("pd: {prefillTimeout: 5}", "pd.prefillTimeout", "duration string"),
    ("pd: {prefillTimeout: 0s}", "pd.prefillTimeout", "greater than 0"),
    ("pd: {prefillTimeout: -1s}", "pd.prefillTimeout", "negative"),
    ("pd: {prefillTimeout: soon}", "pd.prefillTimeout", "invalid duration"),
    ("pd: {prefillTimeout: null}", "pd.prefillTimeout", "null"),
    ("pd: {minUncachedTokens: -1}", "pd.minUncachedTokens", ">= 0"),
    ("pd: {minUncachedTokens: 1.5}", "pd.minUncachedTokens", "integer"),
    ("pd: {minUncachedTokens: true}", "pd.minUncachedTokens", "integer"),
    ("pd: {servers: [a]}", "pd.servers", "mapping of ModelServer name"),
    ("pd: {servers: {a/b/c: {}}}", "pd.servers.a/b/c", "namespace/name"),
    ("pd: {servers: {a: {decode: {}}}}", "pd.servers.a.decode", "unknown field"),
    ("pd: {servers: {a: 3}}", "pd.servers.a", "must be a mapping"),
    ("pd: {servers: {a: {minUncachedTokens: x}}}", "pd.servers.a.minUncachedTokens", "integer"),
    ("pd: {servers: {a: {prefillTimeout: 0s}}}", "pd.servers.a.prefillTimeout", "greater than 0"),
    ("pd: {servers: {a: {}, default/a: {}}}", "pd.servers.default/a", "duplicate"),
    ("pd: {decode: {plugin: {}}}", "pd.decode.plugin", "did you mean 'plugins'"),
    ("pd: {prefill: {plugins: {Score: {enabled: [{name: prefix-cach, weight: 1}]}}}}",
     "pd.prefill.plugins.Score.enabled[0].name", "did you mean 'prefix-cache'"),
    ("pd: {decode: {plugins: {Score: {enabled: [{name: gpu-usage, weight: -1}]}}}}",
     "pd.decode.plugins.Score.enabled[0].weight", ">= 0"),
    ("pd: {decode: {plugins: {Filter: {enabled: [gpu-usage]}}}}",
     "pd.decode.plugins.Filter.enabled[0]", "not a filter plugin"),
    ("pd: {prefill: {pluginConfig: [{name: prefix-cache, args: {blockSize: 3}}]}}",
     "pd.prefill.pluginConfig[0].args.blockSize", "unknown field"),
    ("pd: {prefill: {pluginConfig: [{name: kvcache-aware, args: {tokenizers: [a]}}]}}",
     "pd.prefill.pluginConfig[0].args.tokenizers", "mapping"),
    ("pd: {decode: {pluginConfig: [{name: kvcache-aware, args: {hashSeeds: '0'}}]}}",
     "pd.decode.pluginConfig[0].args.hashSeeds", "unknown field"),
])
def test_errors_name_file_document_and_field(text: str, field: str, fragment: str) -> None:
    got = problems(text + "\n")
    assert any(f == field and fragment in msg for _, _, f, msg in got), got
    assert all(file == "rc.yaml" and doc == "document 1" for file, doc, _, _ in got), got


def test_configmap_document_is_named() -> None:
    text = """
kind: ConfigMap
metadata: {name: kthena-router-config, namespace: kthena-system}
data:
  routerConfiguration: |
    pd: {minUncachedTokens: many}
"""
    (file, doc, field, _), = problems(text)
    assert (file, field) == ("rc.yaml", "pd.minUncachedTokens")
    assert doc == "document 1 (ConfigMap kthena-system/kthena-router-config) data.routerConfiguration"


def test_a_pipeline_rust_refuses_names_the_pd_side(tmp_path) -> None:
    # The YAML rules come from the same registry, so Rust refuses nothing a file can hold;
    # the check is the backstop (build(), validate_router_configuration) and names the side.
    bad = dataclasses.replace(side_settings(DEFAULT_PD, "decode"), filters=("gpu-usage",))
    with pytest.raises(ConfigError) as ei:
        PdPairer().build(PdSettings(decode=bad), "rc.yaml")
    assert (ei.value.file, ei.value.field) == ("rc.yaml", "pd.decode") and "not a filter" in ei.value.message
    path = tmp_path / "rc.yaml"
    path.write_text("pd: {prefill: {plugins: {Score: {enabled: [{name: least-request, weight: 1}]}}}}\n")
    assert validate_router_configuration(path).pd.prefill is not None
