"""PD topology and pairing metrics (on the router's registry; multiprocess like the others, see metrics.py).

Labels are bounded: ModelServers, their PD groups, roles, modes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from kthena_router.metric_labels import LabelChildren

from .topology import PdTopology

ROLES = ("prefill", "decode")


class PdPairingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # Every worker builds the same topology from the same state: livemax reads one value.
        self.endpoints = Gauge(
            "kthena_router_pd_endpoints",
            "Endpoints of a PD ModelServer taking part in pairs, by group and role; role=ignored "
            "(group=\"\"): endpoints left out (no group label, both or neither role, a group "
            "without its other role)",
            ["model_server", "group", "role"], multiprocess_mode="livemax", registry=registry)
        self.servable = Gauge(
            "kthena_router_pd_servable",
            "1 when a PD ModelServer can form at least one prefill/decode pair; 0: its requests "
            "are answered 503 (the reason is logged and in /debug/pd)",
            ["model_server"], multiprocess_mode="livemin", registry=registry)
        self.decisions = Counter(
            "kthena_router_pd_decisions_total",
            "First choice of the pairing per request: mode=two_hop (prefill then decode) or "
            "decode_only (conditional disaggregation: few uncached prompt tokens)",
            ["model_server", "mode"], registry=registry)
        self._child = LabelChildren()
        self._series: set[tuple[str, str, str]] = set()  # endpoints series set so far
        self._servers: set[str] = set()

    def decision(self, server: str, mode: str) -> None:
        self._child(self.decisions, server, mode).inc()

    def set_topologies(self, topos: dict[str, PdTopology]) -> None:
        """Per routing state (server label -> topology). Series of groups and servers that
        are gone drop to 0 (a worker cannot delete a multiprocess series)."""
        now: dict[tuple[str, str, str], int] = {}
        for label, topo in topos.items():
            for g in topo.groups.values():
                now[(label, g.name, "prefill")] = len(g.prefill)
                now[(label, g.name, "decode")] = len(g.decode)
            now[(label, "", "ignored")] = len(topo.ignored)
            self._child(self.servable, label).set(0 if topo.problem else 1)
        for key in self._series - set(now):
            self._child(self.endpoints, *key).set(0)
        for label in self._servers - set(topos):
            self._child(self.servable, label).set(0)
        for key, n in now.items():
            self._child(self.endpoints, *key).set(n)
        self._series |= set(now)
        self._servers |= set(topos)
