"""The scheduler plugin registry, read from the Rust core (rust/core/src/policies): plugin
names, roles and argument specs. It is the one list: adding a plugin means adding its Rust
file and registry row; the configuration loader derives names, validation and defaults
from here.

Plugins whose inputs the router prepares in Python (kvcache-aware's tokenizers and KV
events, prefix-cache's hashing) are Rust registry rows too: their scoring is in Rust, and
the arguments Python reads are listed with ``reader == "router"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .. import _core

__all__ = ["ArgSpec", "PluginSpec", "PLUGINS", "REFUSED_PLUGINS", "SCORE_PLUGINS", "FILTER_PLUGINS",
           "PREFIX_PLUGINS", "KEY_PLUGINS", "arg_default", "args_class"]


@dataclass(frozen=True, slots=True)
class ArgSpec:
    name: str  # Kthena's spelling in pluginConfig[].args
    field: str  # the Python field name
    kind: Literal["int", "float", "bool", "str", "map"]
    default: Any  # None = absent (our documented behaviour applies)
    min: float | None
    max: float | None
    kthena: bool  # Kthena's own argument, or ours
    reader: Literal["policy", "router"]  # the Rust policy (passed to Scorer) or the router
    paths: bool  # map values are file paths, relative to the config file's directory


@dataclass(frozen=True, slots=True)
class PluginSpec:
    name: str
    score: bool
    filter: bool
    affinity: bool
    prefix_input: bool  # scores the per-request prefix match the router computes
    prefix_key: bool  # reads the request's prefix key (hash of its leading blocks)
    args: tuple[ArgSpec, ...]

    def arg(self, name: str) -> ArgSpec | None:
        return next((a for a in self.args if a.name == name), None)


def _arg(d: Mapping[str, Any]) -> ArgSpec:
    default = d["default"]
    if isinstance(default, dict):
        default = MappingProxyType(default)
    return ArgSpec(d["name"], d["field"], d["kind"], default, d["min"], d["max"],
                   d["kthena"], d["reader"], d["paths"])


PLUGINS: Mapping[str, PluginSpec] = MappingProxyType({
    p["name"]: PluginSpec(p["name"], p["score"], p["filter"], p["affinity"], p["prefix_input"],
                          p["prefix_key"], tuple(_arg(a) for a in p["args"]))
    for p in _core.plugin_registry()
})
REFUSED_PLUGINS: Mapping[str, str] = MappingProxyType(dict(_core.refused_plugins()))
SCORE_PLUGINS = tuple(n for n, p in PLUGINS.items() if p.score)
FILTER_PLUGINS = tuple(n for n, p in PLUGINS.items() if p.filter)
PREFIX_PLUGINS = tuple(n for n, p in PLUGINS.items() if p.prefix_input)
KEY_PLUGINS = tuple(n for n, p in PLUGINS.items() if p.prefix_key)


def arg_default(plugin: str, arg: str) -> Any:
    """The registry default of one argument: what the typed args classes use."""
    spec = PLUGINS[plugin].arg(arg)
    if spec is None:
        raise KeyError(f"plugin {plugin!r} has no argument {arg!r} in the registry")
    return spec.default


def _field(a: ArgSpec) -> dataclasses.Field[Any]:
    d = a.default
    if isinstance(d, Mapping):
        return dataclasses.field(default_factory=lambda: MappingProxyType(dict(d)))
    return dataclasses.field(default=d)


def args_class(plugin: str, declared: type | None) -> type:
    """The resolved-arguments class of `plugin`: the declared (typed) one, checked against
    the registry, or one generated from its specs (a plugin only the Rust side knows)."""
    specs = PLUGINS[plugin].args
    if declared is None:
        cls_name = "".join(w.capitalize() for w in plugin.split("-")) + "Args"
        return dataclasses.make_dataclass(cls_name, [(a.field, Any, _field(a)) for a in specs],
                                          frozen=True, slots=True)
    got = [(f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())  # type: ignore[misc]
           for f in dataclasses.fields(declared)]
    want = [(a.field, a.default) for a in specs]
    if got != want:
        raise RuntimeError(f"{declared.__name__} does not match the registry's {plugin!r}: {got} != {want}")
    return declared
