"""Exact KV-event matching by default: the router configuration's `kvEvents` section (ours;
Kthena has no such field) and the rule that decides when a prefix-cache pipeline gets it.

    kvEvents:
      exactMatching: auto   # auto (the default) | off (a bare YAML `off` / false works too)
      sharedPrefixMemory: true   # default: true for automatic matching, false for a listed
                                 # kvcache-aware (Kthena's exact scoring); kv_matcher.py

`auto`: a scheduler pipeline that scores `prefix-cache` (and does not list `kvcache-aware`)
also runs the kvcache-aware matcher (scheduling/kv_matcher.py) for the endpoints that
advertise a KV-event port (Endpoints / pod label `kthena.io/kv-events-port`, optionally
`kthena.io/kv-events-replay-port`), provided `scheduler.pluginConfig` gives the
`kvcache-aware` entry a `tokenizers` map (model name -> tokenizer.json). Those arguments
(tokenizers, hashSeed, blockSizeToHash) are the plugin's, whether the plugin is listed
or runs here. Per endpoint, per request: an endpoint whose stream is up is matched
exactly (token blocks, the engine's own cache); one without the label, whose stream is
down, or a request whose model has no tokenizer gets the approximate index's match, as
kvcache-aware's own fallback does. prefix-cache keeps its weight: no plugin is added,
removed or reweighted, so a plugin list the user wrote is honoured as written; only where
the prefix match comes from changes. `off`: only a pipeline that lists `kvcache-aware`
subscribes to KV events.

The same rule applies to the PD sides (pd.decode / pd.prefill, pd/side_kv.py): each
follows its own engines' streams, with the scheduler section's kvcache-aware arguments
unless the side's pluginConfig has its own. Not applied: pipelines without prefix-cache
(nothing is matched there; the default decode side is one), and a pipeline without
tokenizers (no matcher is built: the default path costs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..config.checks import check_enum, check_mapping

if TYPE_CHECKING:  # config.py imports this module (the section's parser)
    from .config import KvCacheAwareArgs, SchedulerSettings

__all__ = ["DEFAULT_KV_EVENTS", "KvEventsSettings", "auto_exact_args", "parse_kv_events"]

MODES = ("auto", "off")


class Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    exact_matching: Literal["auto", "off"] = "auto"
    shared_prefix_memory: bool | None = None  # None: on for automatic matching only

    def shared_memory(self, auto: bool) -> bool:
        """Whether a matcher (automatic, or the listed kvcache-aware plugin) keeps shared
        prefixes' approximate memory."""
        return auto if self.shared_prefix_memory is None else self.shared_prefix_memory


DEFAULT_KV_EVENTS = KvEventsSettings()


def parse_kv_events(c: Collector, v: Any) -> KvEventsSettings:
    if v is None:
        return DEFAULT_KV_EVENTS
    m = check_mapping(c, v, "kvEvents", ("exactMatching", "sharedPrefixMemory"))
    if m is None:
        return DEFAULT_KV_EVENTS
    mode = "auto"
    v = m.get("exactMatching")
    if isinstance(v, bool):  # YAML 1.1 reads a bare `off` as false
        mode = "auto" if v else "off"
    elif v is not None:
        mode = check_enum(c, v, "kvEvents.exactMatching", MODES) or "auto"
    shared = m.get("sharedPrefixMemory")
    if shared is not None and not isinstance(shared, bool):
        c.err("kvEvents.sharedPrefixMemory", f"must be true or false, got {shared!r}")
        shared = None
    return KvEventsSettings(mode, shared)  # type: ignore[arg-type]


def auto_exact_args(sc: SchedulerSettings, kv_events: KvEventsSettings) -> KvCacheAwareArgs | None:
    """kvcache-aware's arguments when `sc` gets automatic exact matching, else None."""
    if kv_events.exact_matching != "auto" or sc.enabled("kvcache-aware") or not sc.enabled("prefix-cache"):
        return None
    from .config import KvCacheAwareArgs

    args = sc.args.get("kvcache-aware")
    if not isinstance(args, KvCacheAwareArgs) or not args.tokenizers:
        return None
    return args
