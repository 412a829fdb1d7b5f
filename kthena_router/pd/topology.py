"""A PD ModelServer's endpoints split into groups and roles, once per routing state.

Kthena's rule: an endpoint's group is the value of its `pdGroup.groupKey` label; its role is
prefill when it carries every `prefillLabels` pair, decode when it carries every
`decodeLabels` pair. File mode reads the labels from the Endpoints document, Kubernetes
mode from the pods. A server that cannot form one pair gets a `problem`: its requests are
answered 503 with that reason, never served by one hop in silence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kthena_router.config.model import DEFAULT_BOOTSTRAP_PORT, ModelServer
from kthena_router.endpoints.registry import EndpointState, ServerKey

__all__ = ["PdGroup", "PdTopology", "bootstrap_port", "build_topologies", "build_topology"]


@dataclass(frozen=True, slots=True)
class PdGroup:
    name: str  # the groupKey label's value
    prefill: tuple[EndpointState, ...]
    decode: tuple[EndpointState, ...]


@dataclass(frozen=True, slots=True)
class PdTopology:
    server_key: ServerKey
    connector: str  # ModelServer.pd_connector: http | lmcache | nixl | mooncake | bootstrap
    groups: Mapping[str, PdGroup]  # only groups with at least one prefill and one decode
    decode: tuple[EndpointState, ...]  # every decode endpoint of those groups
    group_of: Mapping[str, str] = field(repr=False)  # endpoint key -> group name (paired groups)
    ignored: tuple[str, ...] = ()  # why some endpoints take no part ("ip:port: reason")
    problem: str | None = None  # set: no pair can be formed (the 503's reason)


def bootstrap_port(ep: EndpointState) -> int:
    return ep.bootstrap_port if ep.bootstrap_port is not None else DEFAULT_BOOTSTRAP_PORT


def build_topology(server: ModelServer, targets: tuple[EndpointState, ...]) -> PdTopology:
    pg = server.pd_group
    assert pg is not None
    label = f"{server.namespace}/{server.name}"
    prefill: dict[str, list[EndpointState]] = {}
    decode: dict[str, list[EndpointState]] = {}
    ignored: list[str] = []
    for ep in targets:
        group = ep.labels.get(pg.group_key)
        is_p = all(ep.labels.get(k) == v for k, v in pg.prefill_labels.items())
        is_d = all(ep.labels.get(k) == v for k, v in pg.decode_labels.items())
        if group is None:
            ignored.append(f"{ep.key}: no {pg.group_key!r} label (pdGroup.groupKey)")
        elif is_p and is_d:
            ignored.append(f"{ep.key}: matches both prefillLabels and decodeLabels")
        elif is_p:
            prefill.setdefault(group, []).append(ep)
        elif is_d:
            decode.setdefault(group, []).append(ep)
        else:
            ignored.append(f"{ep.key}: matches neither prefillLabels nor decodeLabels")
    groups: dict[str, PdGroup] = {}
    for name in sorted(set(prefill) | set(decode)):
        p, d = prefill.get(name, []), decode.get(name, [])
        if p and d:
            groups[name] = PdGroup(name, tuple(p), tuple(d))
        else:
            ignored += [f"{ep.key}: group {name!r} has no {'decode' if p else 'prefill'} endpoint" for ep in p + d]
    problem = None
    if not groups:
        n_p = sum(len(v) for v in prefill.values())
        n_d = sum(len(v) for v in decode.values())
        if not n_p and not n_d:
            problem = f"ModelServer {label} (pdGroup) has no prefill and no decode endpoint"
        elif not n_p:
            problem = f"ModelServer {label} (pdGroup) has no prefill endpoint"
        elif not n_d:
            problem = f"ModelServer {label} (pdGroup) has no decode endpoint"
        else:
            problem = (f"ModelServer {label} (pdGroup): no group (label {pg.group_key!r}) has both a prefill "
                       f"and a decode endpoint")
    return PdTopology(
        server_key=server.key, connector=server.pd_connector, groups=groups,
        decode=tuple(ep for g in groups.values() for ep in g.decode),
        group_of={ep.key: g.name for g in groups.values() for ep in g.prefill + g.decode},
        ignored=tuple(ignored), problem=problem)


def build_topologies(servers: Mapping[ServerKey, ModelServer],
                     targets: Mapping[ServerKey, tuple[EndpointState, ...]]) -> dict[ServerKey, PdTopology]:
    return {key: build_topology(s, targets.get(key, ())) for key, s in servers.items() if s.pd_group is not None}
