"""Builders of config documents for the config and routing unit tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kthena_router.config import RouterConfig, load_config_file

API = "networking.serving.volcano.sh/v1alpha1"


def route(name: str = "r", model: str | None = "m", *, rules: list[dict[str, Any]] | None = None,
          lora: list[str] | None = None, ts: str | None = None, ns: str | None = None,
          server: str = "s") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if ts is not None:
        meta["creationTimestamp"] = ts
    if ns is not None:
        meta["namespace"] = ns
    spec: dict[str, Any] = {"rules": rules if rules is not None else [{"targetModels": [{"modelServerName": server}]}]}
    if model is not None:
        spec["modelName"] = model
    if lora is not None:
        spec["loraAdapters"] = lora
    return {"apiVersion": API, "kind": "ModelRoute", "metadata": meta, "spec": spec}


def server(name: str = "s", model: str | None = "upstream-m", *, ns: str | None = None,
           labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
           **spec_extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if ns is not None:
        meta["namespace"] = ns
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"inferenceEngine": "vLLM", "workloadSelector": {"matchLabels": labels or {"app": name}}}
    if model is not None:
        spec["model"] = model
    spec.update(spec_extra)
    return {"apiVersion": API, "kind": "ModelServer", "metadata": meta, "spec": spec}


def endpoints(name: str = "e", eps: list[dict[str, Any]] | None = None, ns: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if ns is not None:
        meta["namespace"] = ns
    return {
        "apiVersion": "router.kthena.io/v1alpha1",
        "kind": "Endpoints",
        "metadata": meta,
        "spec": {"endpoints": eps if eps is not None else [{"address": "127.0.0.1", "port": 9001, "labels": {"app": "s"}}]},
    }


def base() -> list[dict[str, Any]]:
    return [route(), server(), endpoints()]


def dump(docs: list[Any]) -> str:
    return yaml.safe_dump_all(copy.deepcopy(docs), sort_keys=False)


def write(tmp_path: Path, docs: list[Any] | str, name: str = "config.yaml") -> Path:
    p = tmp_path / name
    p.write_text(docs if isinstance(docs, str) else dump(docs))
    return p


def load(tmp_path: Path, docs: list[Any] | str) -> RouterConfig:
    return load_config_file(write(tmp_path, docs))
