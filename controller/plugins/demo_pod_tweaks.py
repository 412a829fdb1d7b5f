"""`demo-pod-tweaks` (Kthena's demo plugin): runtimeClassName, annotations, and env appended
to every container and init container."""

from __future__ import annotations

import copy
from typing import Any

from .registry import REGISTRY, PluginRequest

NAME = "demo-pod-tweaks"
_FIELDS = ("runtimeClassName", "annotations", "env")


class DemoPodTweaks:
    def __init__(self, config: Any) -> None:
        cfg = config or {}
        if not isinstance(cfg, dict):
            raise ValueError("config must be an object")
        unknown = sorted(set(cfg) - set(_FIELDS))
        if unknown:  # Kthena's json.Unmarshal would drop these silently; we say so
            raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(_FIELDS)})")
        self.runtime_class = cfg.get("runtimeClassName") or ""
        self.annotations = cfg.get("annotations") or {}
        self.env = cfg.get("env") or []
        if not isinstance(self.runtime_class, str):
            raise ValueError("runtimeClassName must be a string")
        if not isinstance(self.annotations, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.annotations.items()):
            raise ValueError("annotations must map strings to strings")
        if not isinstance(self.env, list) or not all(isinstance(e, dict) and e.get("name") for e in self.env):
            raise ValueError("env must be a list of {name, value} entries")

    def on_pod_create(self, req: PluginRequest) -> None:
        pod = req.pod
        if self.runtime_class:
            pod["spec"]["runtimeClassName"] = self.runtime_class
        if self.annotations:
            pod["metadata"].setdefault("annotations", {}).update(self.annotations)
        if self.env:
            for key in ("containers", "initContainers"):
                for c in pod["spec"].get(key) or []:
                    c["env"] = list(c.get("env") or []) + copy.deepcopy(self.env)


REGISTRY.register(NAME, DemoPodTweaks)
