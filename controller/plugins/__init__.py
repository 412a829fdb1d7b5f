"""ModelServing `spec.plugins`: Kthena's pod-mutating plugin chain (its BuiltIn plugins)."""

from .chain import Chain, HookRequest, PluginError, build_chain
from .registry import REGISTRY

__all__ = ["REGISTRY", "Chain", "HookRequest", "PluginError", "build_chain"]
