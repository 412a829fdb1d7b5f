"""The one plugin registry: Python's plugin lists and argument validation come from the Rust
registry (_core.plugin_registry), and its argument specs drive the config loader."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kthena_router import _core
from kthena_router.config.errors import ConfigError
from kthena_router.scheduling import config, plugins
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.scheduling.scheduler import KEY_PLUGINS, PREFIX_PLUGINS

RUST = _core.plugin_registry()
SPECS = [(p.name, a) for p in plugins.PLUGINS.values() for a in p.args]


def test_python_lists_equal_the_rust_registry():
    assert config.SCORE_PLUGINS == tuple(p["name"] for p in RUST if p["score"])
    assert config.FILTER_PLUGINS == tuple(p["name"] for p in RUST if p["filter"])
    assert PREFIX_PLUGINS == tuple(p["name"] for p in RUST if p["prefix_input"])
    assert KEY_PLUGINS == tuple(p["name"] for p in RUST if p["prefix_key"]) == ("prefix-hash-bounded",)
    assert dict(config.REFUSED_PLUGINS) == dict(_core.refused_plugins())
    for p in RUST:
        spec = plugins.PLUGINS[p["name"]]
        assert [a.name for a in spec.args] == [a["name"] for a in p["args"]]
    # Kthena's plugin names, all present (a registry edit must not drop one by accident), and ours.
    assert set(config.SCORE_PLUGINS) == {"random", "round-robin", "least-request", "least-latency",
                                         "gpu-usage", "prefix-cache", "kvcache-aware", "lora-affinity",
                                         "prefix-hash-bounded", "prefill-cost"}
    assert set(config.FILTER_PLUGINS) == {"least-request", "lora-affinity"}
    assert set(config.REFUSED_PLUGINS) == {"session-affinity", "cost-aware"}


def test_defaults_and_fields_come_from_the_registry():
    s = load_router_configuration_bytes("", source="x").scheduler
    for name, spec in plugins.PLUGINS.items():
        a = s.args[name]
        assert [f.name for f in dataclasses.fields(a)] == [x.field for x in spec.args]
        for x in spec.args:
            assert getattr(a, x.field) == x.default, (name, x.name)


def test_declared_class_out_of_step_with_the_registry_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Stale:
        max_waiting_requests: int = 99

    with pytest.raises(RuntimeError, match="least-request"):
        plugins.args_class("least-request", Stale)
    generated = plugins.args_class("least-request", None)  # a plugin only Rust declares
    assert generated().max_waiting_requests == 10 and generated(3).max_waiting_requests == 3


def _load(plugin: str, key: str, value: str) -> config.RouterConfiguration:
    text = f"scheduler:\n  pluginConfig:\n  - name: {plugin}\n    args: {{{key}: {value}}}\n"
    return load_router_configuration_bytes(text, source="r.yaml", base_dir=Path("/"))


def _error(plugin: str, key: str, value: str) -> str:
    with pytest.raises(ConfigError) as e:
        _load(plugin, key, value)
    [p] = e.value.problems
    assert p.field == f"scheduler.pluginConfig[0].args.{key}"
    return p.message


WRONG_TYPE = {"int": ('"7"', "must be an integer"), "float": ("fast", "must be a number"),
              "bool": ("1", "must be true or false"), "str": ("[a]", "must be a string"),
              "map": ("[a]", "must be a mapping")}


@pytest.mark.parametrize(("plugin", "spec"), SPECS, ids=[f"{p}.{a.name}" for p, a in SPECS])
def test_every_arg_spec_drives_validation(plugin, spec):
    value, words = WRONG_TYPE[spec.kind]
    assert words in _error(plugin, spec.name, value)
    if spec.min is not None:
        below = spec.min - 1 if spec.kind == "int" else spec.min - 0.5
        text = str(int(below)) if spec.kind == "int" else str(below)
        msg = _error(plugin, spec.name, text)  # refused: Kthena's silent fallback is not kept
        assert "between" in msg or ">=" in msg
    if spec.max is not None:
        above = spec.max + 1
        assert "between" in _error(plugin, spec.name, str(int(above) if spec.kind == "int" else above))
    fine = 0.25 if spec.min is None or spec.min <= 0.25 else spec.min + 0.25  # loadFactor >= 1
    good = {"int": "2", "float": str(fine), "bool": "true", "str": "s1", "map": "{m: t.json}"}[spec.kind]
    got = getattr(_load(plugin, spec.name, good).scheduler.args[plugin], spec.field)
    assert got == {"int": 2, "float": fine, "bool": True, "str": "s1"}.get(spec.kind, got)
    if spec.kind == "map" and spec.paths:
        assert dict(got) == {"m": "/t.json"}  # resolved against the file's directory


@pytest.mark.parametrize(("plugin", "spec"), [(p, a) for p, a in SPECS if a.reader == "policy" and a.min is not None])
def test_scorer_checks_the_policy_args_by_the_same_spec(plugin, spec):
    bad = spec.min - (1 if spec.kind == "int" else 0.5)
    with pytest.raises(ValueError, match=spec.name):
        _core.Scorer([], [(plugin, 1.0)], {plugin: {spec.name: bad}})
    s = _core.Scorer([], [(plugin, 1.0)], {plugin: {spec.name: spec.min}})
    assert s.warnings == []
