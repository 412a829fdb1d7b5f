"""Which benchmark policies get engines that publish KV events: the ones whose router
configuration subscribes to them, listed or through automatic exact matching
(docs/kv-exact-default.md), so that a candidate given with --policy-config is measured
with the events its configuration would use in a deployment."""
import pytest

from kthena_router.config.errors import ConfigError
from loadtest.shared_prefix import policies

BEST = policies.BEST_CONFIG.read_text()
TOKENIZERS = ("  pluginConfig:\n  - name: kvcache-aware\n"
              "    args: {tokenizers: {m: /t/tokenizer.json}, hashSeed: '0'}\n")


def test_best_yaml_alone_subscribes_to_nothing() -> None:
    assert not policies.uses_kv_events(BEST)
    assert not policies.POLICIES["best"].needs_kv_events


def test_prefix_cache_with_tokenizers_matches_exactly_by_default() -> None:
    assert policies.uses_kv_events(BEST.rstrip() + "\n" + TOKENIZERS)
    assert policies.uses_kv_events(BEST.rstrip() + "\n" + TOKENIZERS
                                   + "kvEvents: {exactMatching: auto}\n")


def test_exact_matching_off_subscribes_to_nothing() -> None:
    for off in ("off", "'off'", "false"):
        assert not policies.uses_kv_events(BEST.rstrip() + "\n" + TOKENIZERS
                                           + f"kvEvents: {{exactMatching: {off}}}\n")


def test_tokenizers_without_prefix_cache_subscribe_to_nothing() -> None:
    lr_only = ("scheduler:\n  plugins:\n    Score:\n      enabled:\n"
               "      - {name: least-request, weight: 1}\n" + TOKENIZERS)
    assert not policies.uses_kv_events(lr_only)


def test_tokenizers_given_to_another_plugin_are_refused_as_the_router_refuses_them() -> None:
    other = TOKENIZERS.replace("name: kvcache-aware", "name: prefix-cache")
    with pytest.raises(ConfigError, match="args.tokenizers: unknown field"):
        policies.uses_kv_events(BEST.rstrip() + "\n" + other)


def test_the_built_in_pipeline_with_tokenizers_matches_exactly() -> None:
    # no plugin list: the router's built-in pipeline, which scores prefix-cache
    assert policies.uses_kv_events("scheduler:\n" + TOKENIZERS)


def test_an_invalid_configuration_is_the_router_s_error() -> None:
    with pytest.raises(ConfigError, match="weight"):
        policies.uses_kv_events("scheduler: {plugins: {Score: {enabled: "
                                "[{name: kvcache-aware, weight: -1}]}}}")
