"""PD fields of ModelServer and Endpoints: accepted with Kthena's defaults; settings that
would have no effect are refused, naming file, document and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_fixtures import endpoints, load, route, server

from kthena_router.config import ConfigError
from kthena_router.pd.topology import build_topology

SERVER_DOC = "document 2 (ModelServer default/s)"
PD = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}


def _pd_server(engine: str = "vLLM", **extra: object) -> dict:
    s = server(**extra)
    s["spec"]["inferenceEngine"] = engine
    s["spec"]["workloadSelector"]["pdGroup"] = PD
    return s


def _eps() -> dict:
    return endpoints(eps=[
        {"address": "127.0.0.1", "port": 9001, "labels": {"app": "s", "group": "a", "role": "prefill"},
         "bootstrapPort": 9100},
        {"address": "127.0.0.1", "port": 9002, "labels": {"app": "s", "group": "a", "role": "decode"}},
    ])


@pytest.mark.parametrize("engine,kv,connector", [("vLLM", None, "http"), ("vLLM", {"type": "nixl"}, "nixl"),
                                                  ("vLLM", {}, "http"), ("SGLang", None, "bootstrap")])
def test_pd_server_loads_with_kthena_connector_defaults(tmp_path: Path, engine, kv, connector) -> None:
    s = _pd_server(engine) if kv is None else _pd_server(engine, kvConnector=kv)
    cfg = load(tmp_path, [route(), s, _eps()])
    ms = cfg.servers[("default", "s")]
    assert ms.pd_group is not None and ms.pd_group.group_key == "group"
    assert ms.pd_connector == connector
    eps = cfg.endpoints_of(ms)
    assert [e.bootstrap_port for e in eps] == [9100, None]


@pytest.mark.parametrize("engine,extra,field,fragment", [
    ("vLLM", {"kvConnector": {"type": "nixl"}}, "spec.kvConnector", "only with workloadSelector.pdGroup"),
    ("SGLang", {"kvConnector": {"type": "mooncake"}}, "spec.kvConnector", "bootstrap protocol"),
    ("vLLM", {"kvConnector": {"type": "rdma"}}, "spec.kvConnector.type", "must be one of http, lmcache, nixl, mooncake"),
])
def test_ineffective_or_wrong_kv_connector_is_refused(tmp_path: Path, engine, extra, field, fragment) -> None:
    s = server(**extra)
    s["spec"]["inferenceEngine"] = engine
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, [route(), s, endpoints()])
    err = ei.value
    assert (err.document, err.field) == (SERVER_DOC, field), str(err)
    assert fragment in err.message and err.file.endswith("config.yaml")


def test_pd_group_shape_is_checked(tmp_path: Path) -> None:
    s = server()
    s["spec"]["workloadSelector"]["pdGroup"] = {"groupKey": "g", "decodeLabels": {"r": "d"}}
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, [route(), s, endpoints()])
    assert ei.value.field == "spec.workloadSelector.pdGroup.prefillLabels" and "required" in ei.value.message


def test_bootstrap_port_range_is_checked(tmp_path: Path) -> None:
    eps = endpoints(eps=[{"address": "127.0.0.1", "port": 9001, "bootstrapPort": 70000}])
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, [route(), server(), eps])
    assert ei.value.field == "spec.endpoints[0].bootstrapPort"


def test_parent_refs_are_accepted(tmp_path: Path) -> None:
    r, s = route(), server()
    r["spec"]["parentRefs"] = [{"name": "gw", "kind": "Gateway"}]
    cfg = load(tmp_path, [r, s, endpoints()])
    assert cfg.routes[0].parent_refs == ({"name": "gw", "kind": "Gateway"},)
