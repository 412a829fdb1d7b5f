"""The registry of BuiltIn plugins (name -> factory), filled by the plugin modules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["REGISTRY", "Plugin", "PluginError", "PluginRequest", "Registry"]

Obj = dict[str, Any]


class PluginError(ValueError):
    """A plugin that cannot be built or cannot mutate a pod: no pod of that ModelServing is created."""


@dataclass
class PluginRequest:
    """What a plugin sees of one pod about to be created (Kthena's HookRequest)."""
    modelserving: Obj
    serving_group: str
    role: str
    role_id: str
    is_entry: bool
    pod: Obj  # mutated in place


class Plugin(Protocol):
    def on_pod_create(self, req: PluginRequest) -> None: ...


Factory = Callable[[Any], Plugin]  # the plugin's `config` (parsed JSON or None) -> plugin


class Registry:
    def __init__(self) -> None:
        self.factories: dict[str, Factory] = {}

    def register(self, name: str, factory: Factory) -> None:
        self.factories[name] = factory


REGISTRY = Registry()
