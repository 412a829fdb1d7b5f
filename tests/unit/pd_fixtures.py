"""Builders for the PD unit tests: a PD ModelServer, its endpoints (labels = roles and
groups) and a RouterState built the way the applier builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config_fixtures import endpoints, load, route, server

from kthena_router.endpoints.health import EndpointHealth
from kthena_router.endpoints.registry import EndpointState
from kthena_router.routing.table import RouteTable
from kthena_router.state import RouterState, build_state

PD = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}
KEY = ("default", "s")


def ep(port: int, group: str | None, role: str | None, **extra: str) -> dict[str, Any]:
    labels = {"app": "s", **extra}
    if group is not None:
        labels["group"] = group
    if role is not None:
        labels["role"] = role
    return {"address": "127.0.0.1", "port": port, "labels": labels}


def pd_state(tmp_path: Path, eps: list[dict[str, Any]], pd: dict[str, Any] | None = None,
             engine: str = "vLLM") -> RouterState:
    s = server()
    s["spec"]["inferenceEngine"] = engine
    s["spec"]["workloadSelector"]["pdGroup"] = pd or PD
    cfg = load(tmp_path, [route(), s, endpoints(eps=eps)])
    ms = cfg.servers[KEY]
    targets = tuple(EndpointState(f"{e.address}:{e.port}", e.address, e.port or 8000, e.address, "http", None,
                                  EndpointHealth(), {}, "default/s", e.labels, e.bootstrap_port)
                    for e in cfg.endpoints_of(ms))
    return build_state(cfg, RouteTable.build(cfg), {KEY: targets})
