"""The router configuration's `pd` section (ours; Kthena's CRDs are not extended).

```yaml
pd:
  decode:  {plugins: ..., pluginConfig: ...}    # Kthena's scheduler shape; the decode side
  prefill: {plugins: ..., pluginConfig: ...}    # the prefill side (prefix cache matters here)
                               # kvcache-aware (listed, or automatic under prefix-cache with
                               # kvEvents.exactMatching: auto) follows each side's own engines'
                               # KV events; its args default to scheduler.pluginConfig's
  prefillTimeout: 60s          # the whole prefill hop (its reply; SGLang: its reply after the push)
  minUncachedTokens: 0         # conditional disaggregation; 0 = always two hops
  servers:                     # per ModelServer, keyed "namespace/name" or "name"
    llama-pd: {prefillTimeout: 30s, minUncachedTokens: 512}
```

The decode hop keeps the server's usual timeouts (the `traffic` section / trafficPolicy).
The parser is pd/config_parse.py (it reuses the scheduler-section parser).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kthena_router.config.model import DEFAULT_NAMESPACE
from kthena_router.scheduling.exact_auto import DEFAULT_KV_EVENTS, KvEventsSettings

if TYPE_CHECKING:  # scheduling.config imports this module
    from kthena_router.scheduling.config import SchedulerSettings

__all__ = ["DEFAULT_PD", "PdServerSettings", "PdSettings"]


@dataclass(frozen=True, slots=True)
class PdServerSettings:
    prefill_timeout_s: float = 60.0
    min_uncached_tokens: int = 0  # below this many uncached prompt tokens: decode alone


@dataclass(frozen=True, slots=True)
class PdSettings:
    # each side's pipeline; None = that side's default (config_parse.DECODE_DEFAULT /
    # PREFILL_DEFAULT: decode least-request + gpu-usage, prefill prefix-cache + least-request)
    decode: SchedulerSettings | None = None
    prefill: SchedulerSettings | None = None
    defaults: PdServerSettings = PdServerSettings()
    servers: Mapping[str, PdServerSettings] = field(default_factory=dict)  # "namespace/name"
    # the top-level kvEvents section (a side that scores prefix-cache gets exact matching
    # under `auto`, as the scheduler section does; config_parse.with_kv_events)
    kv_events: KvEventsSettings = DEFAULT_KV_EVENTS

    def for_server(self, namespace: str, name: str) -> PdServerSettings:
        s = self.servers.get(f"{namespace}/{name}")
        if s is None and namespace == DEFAULT_NAMESPACE:
            s = self.servers.get(name)
        return s if s is not None else self.defaults


DEFAULT_PD = PdSettings()
