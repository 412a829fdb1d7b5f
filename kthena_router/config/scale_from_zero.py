"""The router configuration's `scaleFromZero` section (ours, not Kthena's).

While an autoscaler has scaled a ModelServer to zero replicas, the router has no endpoint to
send its requests to. With holding on, a request for such a server waits (is "held") until
an endpoint appears (a config reload in file mode, the pods' view in Kubernetes mode), up
to `holdTimeout`, then gets 503. Held requests are counted in
kthena_router_pending_requests{model,model_server}, which the autoscaler reads to scale up.

    scaleFromZero:
      holdTimeout: 60s        # 0s (the default): no holding, 503 at once as before
      maxPending: 256         # held requests per ModelServer in the whole router; beyond: 503 at once
      modelServers:           # overrides; key "name" (namespace default) or "namespace/name"
        llama-70b: {holdTimeout: 300s, maxPending: 64}

Off unless configured: a hold is only worth its wait when something (an autoscaler) will
bring replicas back. Only a ModelServer with *no* endpoint at all is held for; one whose
endpoints exist but are all ejected answers as before. maxPending bounds memory (a held
request keeps its body): each of the router's N workers holds up to ceil(maxPending / N).
Unknown fields and invalid values are errors; a reload with an error keeps the old section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .checks import check_duration, check_int, check_mapping, join_path, named_overrides
from .traffic import Collector

__all__ = ["DEFAULT_SCALE_FROM_ZERO", "HoldSettings", "ScaleFromZeroSettings", "parse_scale_from_zero"]

_KEYS = ("holdTimeout", "maxPending")
MAX_PENDING_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True)
class HoldSettings:
    """Effective settings of one ModelServer."""

    hold_timeout_s: float = 0.0  # 0: holding off
    max_pending: int = 256

    @property
    def enabled(self) -> bool:
        return self.hold_timeout_s > 0


@dataclass(frozen=True, slots=True)
class ScaleFromZeroSettings:
    defaults: HoldSettings = field(default_factory=HoldSettings)
    overrides: Mapping[str, HoldSettings] = field(default_factory=lambda: MappingProxyType({}))

    def for_server(self, namespace: str, name: str) -> HoldSettings:
        return self.overrides.get(f"{namespace}/{name}", self.defaults) if self.overrides else self.defaults


DEFAULT_SCALE_FROM_ZERO = ScaleFromZeroSettings()


def parse_scale_from_zero(c: Collector, v: Any, path: str = "scaleFromZero") -> ScaleFromZeroSettings:
    """Validate the section; problems go to `c` (the result then holds defaults)."""
    if v is None:
        return DEFAULT_SCALE_FROM_ZERO
    m = check_mapping(c, v, path, _KEYS + ("modelServers",))
    if m is None:
        return DEFAULT_SCALE_FROM_ZERO
    defaults = _settings(c, HoldSettings(), m, path)
    overrides: dict[str, HoldSettings] = {}
    for key, p, item in named_overrides(c, m.get("modelServers"), join_path(path, "modelServers"), "ModelServer"):
        if check_mapping(c, item, p, _KEYS) is not None:
            overrides[key] = _settings(c, defaults, item, p)
    return ScaleFromZeroSettings(defaults, MappingProxyType(overrides))


def _settings(c: Collector, base: HoldSettings, m: Mapping[str, Any], path: str) -> HoldSettings:
    out = base
    if m.get("holdTimeout") is not None:
        timeout = check_duration(c, m["holdTimeout"], join_path(path, "holdTimeout"))
        if timeout is not None:
            out = dataclasses.replace(out, hold_timeout_s=timeout)
    if m.get("maxPending") is not None:
        n = check_int(c, m["maxPending"], join_path(path, "maxPending"), 1, MAX_PENDING_LIMIT)
        if n is not None:
            out = dataclasses.replace(out, max_pending=n)
    return out
