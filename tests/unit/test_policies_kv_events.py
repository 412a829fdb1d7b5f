"""Which benchmark policies get engines that publish KV events: the ones whose router
configuration subscribes to them, listed or through automatic exact matching
(docs/kv-exact-default.md), so that a candidate given with --policy-config is measured
with the events its configuration would use in a deployment."""
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


def test_tokenizers_of_another_plugin_do_not_count() -> None:
    other = TOKENIZERS.replace("name: kvcache-aware", "name: prefix-cache")
    assert not policies.uses_kv_events(BEST.rstrip() + "\n" + other)
