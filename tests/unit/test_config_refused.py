"""Kthena fields the router does not enforce yet are refused at load, naming the field;
a refused block with a wrong shape reports the shape problem too."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_fixtures import endpoints, load, route, server

from kthena_router.config import ConfigError

ROUTE_DOC = "document 1 (ModelRoute default/r)"
SERVER_DOC = "document 2 (ModelServer default/s)"
PD = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}

REFUSED = [
    ("server", "kvConnector", {"type": "nixl"}, "spec.kvConnector", "KV transfer"),
    ("server", "kvConnector", {}, "spec.kvConnector", "KV transfer"),
    ("server", "pdGroup", PD, "spec.workloadSelector.pdGroup", "prefill/decode disaggregation"),
]


def _docs(kind: str, key: str, value: object) -> list[dict]:
    r, s = route(), server()
    if kind == "route":
        r["spec"][key] = value
    elif key == "pdGroup":
        s["spec"]["workloadSelector"]["pdGroup"] = value
    else:
        s["spec"][key] = value
    return [r, s, endpoints()]


@pytest.mark.parametrize("kind,key,value,field,what", REFUSED, ids=[f"{r[3]}-{i}" for i, r in enumerate(REFUSED)])
def test_refused_field_names_file_document_and_field(tmp_path: Path, kind, key, value, field, what) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, _docs(kind, key, value))
    err = ei.value
    assert len(err.problems) == 1, str(err)
    assert err.file.endswith("config.yaml")
    assert (err.document, err.field) == (ROUTE_DOC if kind == "route" else SERVER_DOC, field)
    assert err.message.startswith(f"{what} ") and "is not supported yet" in err.message
    assert str(err) == f"{err.file}: {err.document}: {field}: {err.message}"


SHAPE_AND_REFUSAL = [
    ("server", "pdGroup", {"groupKey": "g", "decodeLabels": {"r": "d"}}, "spec.workloadSelector.pdGroup.prefillLabels",
     "required"),
    ("server", "kvConnector", {"type": "rdma"}, "spec.kvConnector.type", "must be one of http, lmcache, nixl, mooncake"),
]


@pytest.mark.parametrize("kind,key,value,field,fragment", SHAPE_AND_REFUSAL, ids=[r[3] for r in SHAPE_AND_REFUSAL])
def test_refused_block_with_wrong_shape_reports_both(tmp_path: Path, kind, key, value, field, fragment) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, _docs(kind, key, value))
    problems = ei.value.problems
    assert len(problems) == 2, str(ei.value)
    assert problems[0].field == field and fragment in problems[0].message
    assert "is not supported yet" in problems[1].message and field.startswith(problems[1].field)


def test_refused_server_is_not_reported_again_by_its_routes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, _docs("server", "kvConnector", {"type": "http"}))
    assert [p.field for p in ei.value.problems] == ["spec.kvConnector"]


def test_parent_refs_are_accepted(tmp_path: Path) -> None:
    r, s = route(), server()
    r["spec"]["parentRefs"] = [{"name": "gw", "kind": "Gateway"}]
    cfg = load(tmp_path, [r, s, endpoints()])
    assert cfg.routes[0].parent_refs == ({"name": "gw", "kind": "Gateway"},)
