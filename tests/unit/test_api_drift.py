"""The CRDs and the router's file-mode parsers cannot drift from the API declarations
(kthena_router/api):

1. configs/crds/*.yaml equal what the generator writes, byte for byte;
2. for ModelRoute, ModelServer and ExternalModelProvider, the parsers apply the declared rules:
   the same known fields and required fields at every object, the same enums, the same integer
   bounds, the same list-size and string-length limits (observed while they parse documents
   that reach every declared object, and by feeding them values just outside the bounds);
3. unknown fields are kept only where Kthena's schema keeps them (free-form JSON);
4. the declarations import nothing of the router's runtime.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kthena_router.api import crdgen
from kthena_router.api.kinds import KINDS, by_kind
from kthena_router.api.schema import UNSET, Node, iter_nodes
from kthena_router.config import checks, external_provider_parse, model_route, model_server
from kthena_router.config.checks import Ctx
from kthena_router.config.metadata import ObjectMeta

REPO = Path(__file__).resolve().parents[2]


# --- 1. generated files ----------------------------------------------------------------------
def test_committed_crds_equal_the_generator_output() -> None:
    want = crdgen.expected_files()
    have = {p.name: p.read_text(encoding="utf-8") for p in crdgen.CRD_DIR.glob("*.yaml")}
    assert sorted(have) == sorted(want), "configs/crds holds other files than the generator writes"
    for name, text in want.items():
        assert have[name] == text, f"configs/crds/{name} is stale: run python -m kthena_router.api.crdgen"
    assert crdgen.main(["--check"]) == 0


def test_generator_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 0
    victim = tmp_path / crdgen.file_name(by_kind("ModelServer"))
    victim.write_text(victim.read_text().replace("maximum: 65535", "maximum: 65536"))
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1


# --- 3. no silent pruning ----------------------------------------------------------------------
def _preserve_paths(schema: Any, path: str = "") -> Iterator[str]:
    if isinstance(schema, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            yield path
        for k, v in schema.items():
            if k == "properties":
                for name, sub in v.items():
                    yield from _preserve_paths(sub, f"{path}.{name}")
            elif k == "items":
                yield from _preserve_paths(v, path + "[]")
            elif k == "additionalProperties":
                yield from _preserve_paths(v, path + "{}")


def test_unknown_fields_are_kept_only_in_free_form_json() -> None:
    found = {k.kind: sorted(_preserve_paths(k.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
             for k in KINDS}
    assert found == {
        "ModelRoute": [], "ModelServer": [], "ExternalModelProvider": [], "AutoscalingPolicy": [],
        "ModelServing": [".spec.plugins[].config"],  # apiextensions JSON in Kthena's types
        "ModelBooster": [".spec.backend.workers[].config"],  # engine arguments, JSON in Kthena's types
    }


def test_file_mode_only_fields_stay_out_of_the_crds() -> None:
    """Kthena's schemas are never extended: sessionSticky (a proposal) is file-mode only."""
    spec = by_kind("ModelRoute").crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "sessionSticky" not in spec["properties"]
    assert "sessionSticky" in by_kind("ModelRoute").spec.known()


# --- 4. import boundary -----------------------------------------------------------------------
def test_declarations_import_no_router_runtime() -> None:
    code = ("import sys, kthena_router.api.kinds, kthena_router.api.crdgen; "
            "print(sorted(m for m in sys.modules if m.startswith('kthena_router')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    mods = eval(out.stdout)  # a printed list of module names
    assert mods and all(m == "kthena_router" or m.startswith("kthena_router.api") for m in mods), mods


# --- 2. parsers follow the declarations ---------------------------------------------------------
_ROUTE = {
    "modelName": "m",
    "loraAdapters": ["lora-a"],
    "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "ns", "name": "gw",
                    "sectionName": "http", "port": 80}],
    "rules": [{
        "name": "r",
        "modelMatch": {"headers": {"x-user": {"exact": "a"}, "x-org": {"prefix": "a"}, "x-team": {"regex": "^a"}},
                       "uri": {"prefix": "/v1"}, "body": {"model": "m"}},
        "targetModels": [{"modelServerName": "s", "weight": 50}, {"externalModelProviderName": "e", "weight": 50}],
    }, {"modelMatch": {"uri": {"exact": "/v1/completions"}}, "targetModels": [{"modelServerName": "s"}]},
        {"modelMatch": {"uri": {"regex": "^/v1/"}}, "targetModels": [{"modelServerName": "s"}]}],
    "rateLimit": {"inputTokensPerUnit": 10, "outputTokensPerUnit": 10, "unit": "minute",
                  "global": {"redis": {"address": "127.0.0.1:6379"}}},
    "sessionSticky": {"sources": [{"type": "Header", "name": "x-session"}], "sessionAffinitySeconds": 60},
}
_SERVER = {
    "model": "m", "inferenceEngine": "vLLM",
    "workloadSelector": {"matchLabels": {"app-name": "m"},
                         "pdGroup": {"groupKey": "g", "prefillLabels": {"role-kind": "p"},
                                     "decodeLabels": {"role-kind": "d"}}},
    "workloadPort": {"port": 8000, "protocol": "https"},
    "trafficPolicy": {"timeout": "5s", "retry": {"attempts": 2, "retryInterval": "1s"}},
    "kvConnector": {"type": "nixl"},
}
_PROVIDER = {
    "providerType": "Anthropic", "model": "claude", "baseURL": "https://api.example.com",
    "insecureSkipVerify": False, "auth": {"scheme": "APIKey", "secretRef": {"name": "s", "key": "k"}},
    "headers": {"x-team": "a"},
}
_PARSERS: dict[str, Callable[[Ctx, Any], Any]] = {
    "ModelRoute": lambda c, spec: model_route.parse_model_route(c, _meta(), spec, 0),
    "ModelServer": lambda c, spec: model_server.parse_model_server(c, _meta(), spec, REPO),
    "ExternalModelProvider": lambda c, spec: external_provider_parse.parse_external_provider(c, _meta(), spec, REPO),
}
_DOCS = {"ModelRoute": _ROUTE, "ModelServer": _SERVER, "ExternalModelProvider": _PROVIDER}

# Where file mode knowingly differs from the CRD (docs/crds.md, "What is validated where"):
_REQUIRED_DIFFS = {
    # file mode defaults the port (Kubernetes requires it): a plain config file may omit it
    ("ModelServer", "spec"): {"workloadPort"},
    # the parser reports a missing rules list with its own message, not through check_mapping
    ("ModelRoute", "spec"): {"rules"},
    # Kubernetes lets name default to ""; the router needs the Secret's name
    ("ExternalModelProvider", "spec.auth.secretRef"): {"-name"},
}


def _meta() -> ObjectMeta:
    return ObjectMeta("obj", "default", {}, None)


def _norm(path: str) -> str:
    return re.sub(r'\["[^"]*"\]', "{}", re.sub(r"\[\d+\]", "[]", path))


def _objects(kind: str) -> dict[str, tuple[set[str], set[str]]]:
    """Declared object nodes under spec: path -> (known fields, required fields without defaults)."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    for path, node in iter_nodes(by_kind(kind).spec, "spec"):
        if node.openapi is not None and "properties" in node.openapi:  # a Kubernetes type (SecretKeySelector)
            props = node.openapi["properties"]
            out[path] = (set(props), {r for r in node.openapi.get("required", ()) if "default" not in props[r]})
        elif node.properties:
            out[path] = (set(node.known()),
                         {f.name for f in node.properties if f.required and f.node.default is UNSET})
    return out


class _Recorder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mappings: dict[str, tuple[set[str], set[str]]] = {}
        self.enums: dict[str, tuple[str, ...]] = {}
        self.ints: dict[str, tuple[int, int | None]] = {}
        real_map, real_enum, real_int = checks.check_mapping, checks.check_enum, checks.check_int

        def rec_map(c: Any, v: Any, path: str, known: Any, required: Any = ()) -> Any:
            self.mappings[_norm(path)] = (set(known), set(required))
            return real_map(c, v, path, known, required)

        def rec_enum(c: Any, v: Any, path: str, allowed: tuple[str, ...]) -> Any:
            self.enums[_norm(path)] = tuple(allowed)
            return real_enum(c, v, path, allowed)

        def rec_int(c: Any, v: Any, path: str, lo: int, hi: int | None = None) -> Any:
            self.ints[_norm(path)] = (lo, hi)
            return real_int(c, v, path, lo, hi)

        for mod in (checks, model_route, model_server, external_provider_parse):
            for name, fn in (("check_mapping", rec_map), ("check_enum", rec_enum), ("check_int", rec_int)):
                if hasattr(mod, name):
                    monkeypatch.setattr(mod, name, fn)


def _parse(kind: str, spec: Any) -> list[str]:
    c = Ctx("test.yaml", kind, [])
    _PARSERS[kind](c, spec)
    return [f"{p.field}: {p.message}" for p in c.problems]


@pytest.mark.parametrize("kind", sorted(_DOCS))
def test_the_sample_document_uses_every_declared_field_and_parses(kind: str) -> None:
    doc = _DOCS[kind]
    used = {_norm(p) for p in _concrete_paths(doc, "spec")}
    declared = {p for p, _ in iter_nodes(by_kind(kind).spec, "spec")}
    assert declared <= used, f"declare a sample value for {sorted(declared - used)}"
    assert _parse(kind, copy.deepcopy(doc)) == []


@pytest.mark.parametrize("kind", sorted(_DOCS))
def test_parsers_know_the_declared_fields_enums_and_bounds(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder(monkeypatch)
    assert _parse(kind, copy.deepcopy(_DOCS[kind])) == []
    for path, (known, required) in _objects(kind).items():
        assert path in rec.mappings, f"{kind} parser never checks the fields of {path}"
        p_known, p_required = rec.mappings[path]
        assert p_known == known, f"{kind} {path}: parser knows {sorted(p_known)}, declared {sorted(known)}"
        diff = _REQUIRED_DIFFS.get((kind, path), set())
        want = (required - diff) | {d[1:] for d in diff if d.startswith("-")}
        assert p_required == want, f"{kind} {path}: parser requires {sorted(p_required)}, declared {sorted(required)}"
    for path, node in iter_nodes(by_kind(kind).spec, "spec"):
        if node.enum:
            assert rec.enums.get(path) == node.enum, f"{kind} {path}: parser enum {rec.enums.get(path)}"
        if node.type == "integer" and (node.minimum is not None or node.maximum is not None):
            assert path in rec.ints, f"{kind} {path}: parser does not check the integer's bounds"
            lo, hi = rec.ints[path]
            if node.minimum is not None:
                assert lo == node.minimum, f"{kind} {path}: parser minimum {lo}, declared {node.minimum}"
            if node.maximum is not None:
                assert hi == node.maximum, f"{kind} {path}: parser maximum {hi}, declared {node.maximum}"
    for path, allowed in rec.enums.items():
        assert _node(kind, path).enum == allowed, f"{kind} {path}: parser has an enum the declarations lack"


@pytest.mark.parametrize("kind", sorted(_DOCS))
def test_parsers_enforce_declared_sizes(kind: str) -> None:
    """maxItems / minItems / maxLength: a value just outside is refused at that field, the limit accepted."""
    checked = 0
    for path, node in iter_nodes(by_kind(kind).spec, "spec"):
        for limit, make in ((node.max_items, lambda v, n: (v * (n + 1))[:n]),
                            (node.max_length, lambda v, n: (v * (n + 1))[:n])):
            if limit is None:
                continue
            checked += 1
            over = _with(kind, path, lambda v: make(v, limit + 1))
            assert any(p.startswith(_concrete(kind, path) + ":") for p in _parse(kind, over)), (kind, path, "over")
            at = _with(kind, path, lambda v: make(v, limit))
            assert not any(p.startswith(_concrete(kind, path) + ":") for p in _parse(kind, at)), (kind, path, "at")
        if node.min_items:
            checked += 1
            under = _with(kind, path, lambda v: v[: node.min_items - 1])
            assert any(p.startswith(_concrete(kind, path) + ":") for p in _parse(kind, under)), (kind, path)
    assert checked or kind == "ModelServer"


def _node(kind: str, path: str) -> Node:
    for p, n in iter_nodes(by_kind(kind).spec, "spec"):
        if p == path:
            return n
    raise AssertionError(f"{kind}: the parser checks {path}, which the declarations lack")


def _concrete_paths(v: Any, path: str) -> Iterator[str]:
    yield path
    if isinstance(v, dict):
        for k, sub in v.items():
            yield from _concrete_paths(sub, checks.join_path(path, k))
    elif isinstance(v, list):
        for i, sub in enumerate(v):
            yield from _concrete_paths(sub, f"{path}[{i}]")


def _concrete(kind: str, path: str) -> str:
    return next(p for p in _concrete_paths(_DOCS[kind], "spec") if _norm(p) == path)


def _with(kind: str, path: str, change: Callable[[Any], Any]) -> Any:
    """A copy of the sample spec with the value at (the first instance of) ``path`` changed."""
    doc = copy.deepcopy(_DOCS[kind])
    steps = re.findall(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\["([^"]*)"\]', _concrete(kind, path)[len("spec"):])
    parent: Any = doc
    keys: list[Any] = [a or (int(b) if b else c) for a, b, c in steps]
    for k in keys[:-1]:
        parent = parent[k]
    parent[keys[-1]] = change(parent[keys[-1]])
    return json.loads(json.dumps(doc))
