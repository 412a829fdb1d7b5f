"""The worker's current routing state, swapped atomically on reload.

A request reads `holder.current` once and keeps that snapshot to its end, so a reload
never changes config, route table or endpoint lists under an in-flight request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson

from kthena_router.config.model import RouterConfig
from kthena_router.config.traffic import DEFAULT_TRAFFIC, ServerTraffic, TrafficSettings
from kthena_router.endpoints.registry import EndpointState, ServerKey
from kthena_router.pd.topology import PdTopology, build_topologies
from kthena_router.routing.table import RouteTable


@dataclass(frozen=True, slots=True)
class RouterState:
    config: RouterConfig
    table: RouteTable
    targets: Mapping[ServerKey, tuple[EndpointState, ...]]
    models_body: bytes = field(repr=False)  # GET /v1/models, encoded once per state
    # the router configuration's traffic section, resolved once per state for every server
    traffic: TrafficSettings = DEFAULT_TRAFFIC
    server_traffic: Mapping[ServerKey, ServerTraffic] = field(default_factory=dict, repr=False)
    pd: Mapping[ServerKey, PdTopology] = field(default_factory=dict, repr=False)  # PD servers only

    def traffic_of(self, key: ServerKey) -> ServerTraffic:
        st = self.server_traffic.get(key)
        return st if st is not None else self.traffic.defaults


def models_payload(table: RouteTable, created: int | None = None) -> bytes:
    """OpenAI list shape: route model names and LoRA adapter names."""
    ts = int(time.time()) if created is None else created
    data = [{"id": name, "object": "model", "created": ts, "owned_by": "kthena"}
            for name, _is_lora in table.model_names()]
    return orjson.dumps({"object": "list", "data": data})


def resolve_traffic(cfg: RouterConfig, traffic: TrafficSettings) -> dict[ServerKey, ServerTraffic]:
    """Every ModelServer's effective traffic settings (override > trafficPolicy > default)."""
    return {key: traffic.for_server(s.namespace, s.name, s.timeout_s) for key, s in cfg.servers.items()}


def build_state(cfg: RouterConfig, table: RouteTable, targets: Mapping[ServerKey, tuple[EndpointState, ...]],
                traffic: TrafficSettings = DEFAULT_TRAFFIC) -> RouterState:
    return RouterState(cfg, table, targets, models_payload(table), traffic, resolve_traffic(cfg, traffic),
                       build_topologies(cfg.servers, targets))


class StateHolder:
    """The current state and its generation, bumped by every install.

    Installs are compare-and-swap: a writer names the generation its new state was based
    on, and installs nothing if another install happened meanwhile (e.g. a DNS refresh that
    awaited resolution while a reload installed a newer config). Readers on the event loop
    see one reference, swapped by assignment.
    """

    __slots__ = ("current", "generation", "listeners")

    def __init__(self) -> None:
        self.current: RouterState | None = None
        self.generation = 0
        # called after each install, on the loop: whatever caches the state follows it at once
        self.listeners: list[Callable[[RouterState], None]] = []

    def install(self, state: RouterState, based_on: int) -> bool:
        """Install ``state`` if ``based_on`` is still the current generation."""
        if based_on != self.generation:
            return False
        self.current = state
        self.generation += 1
        for listener in self.listeners:
            listener(state)
        return True
