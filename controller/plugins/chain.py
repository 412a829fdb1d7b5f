"""A ModelServing's plugin chain: built once per reconcile from `spec.plugins`, run in list
order on every pod before it is created (Kthena's OnPodCreate; OnPodReady hooks of the
BuiltIn plugins do nothing, so none are run). An unknown name, a type other than BuiltIn or a
config the plugin refuses is a PluginError: the controller creates no pod of that
ModelServing (a pod without its plugins would be wrong) and says why in a condition."""

from __future__ import annotations

from typing import Any

from . import demo_pod_tweaks, lws_labels  # noqa: F401  (they register themselves)
from .registry import REGISTRY, Plugin, PluginError, PluginRequest, Registry

__all__ = ["Chain", "HookRequest", "PluginError", "build_chain"]

HookRequest = PluginRequest
Obj = dict[str, Any]
_TARGETS = ("All", "Entry", "Worker")


def _runs(spec: Obj, req: PluginRequest) -> bool:
    scope = spec.get("scope") or {}
    roles = scope.get("roles") or []
    if roles and req.role not in roles:
        return False
    target = scope.get("target") or "All"
    return target == "All" or target == ("Entry" if req.is_entry else "Worker")


class Chain:
    def __init__(self, entries: list[tuple[Obj, Plugin]]) -> None:
        self.entries = entries

    def __bool__(self) -> bool:
        return bool(self.entries)

    def on_pod_create(self, req: PluginRequest) -> None:
        for spec, plugin in self.entries:
            if _runs(spec, req):
                try:
                    plugin.on_pod_create(req)
                except PluginError as exc:
                    raise PluginError(f"plugin {spec['name']} on pod {req.pod['metadata']['name']}: {exc}") from None


def build_chain(ms: Obj, registry: Registry = REGISTRY) -> Chain:
    entries: list[tuple[Obj, Plugin]] = []
    for i, spec in enumerate((ms.get("spec") or {}).get("plugins") or []):
        name = str(spec.get("name") or "")
        kind = spec.get("type") or "BuiltIn"
        if kind != "BuiltIn":
            raise PluginError(f"spec.plugins[{i}] ({name}): unsupported type {kind!r} (only BuiltIn)")
        target = (spec.get("scope") or {}).get("target") or "All"
        if target not in _TARGETS:
            raise PluginError(f"spec.plugins[{i}] ({name}): scope.target must be one of {', '.join(_TARGETS)}")
        factory = registry.factories.get(name)
        if factory is None:
            raise PluginError(f"spec.plugins[{i}]: plugin {name!r} is not registered "
                              f"(known: {', '.join(sorted(registry.factories))})")
        try:
            entries.append((spec, factory(spec.get("config"))))
        except (PluginError, TypeError, ValueError) as exc:
            raise PluginError(f"spec.plugins[{i}] ({name}): bad config: {exc}") from None
    return Chain(entries)
