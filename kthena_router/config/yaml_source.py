"""Config bytes -> YAML documents: UTF-8 decoding, content digest, strict YAML parsing.

Shared by the route config (config.loader) and the router configuration
(scheduling.config), so both report encoding and syntax errors alike.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, ConfigProblem

__all__ = ["StrictLoader", "decode_config_text", "load_yaml_documents", "read_config_file", "yaml_problem"]

_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loader (C parser when available) that rejects duplicate mapping keys,
    which PyYAML would otherwise resolve silently to the last value."""


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)  # type: ignore[arg-type]


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_config_file(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes, or a ConfigError naming the file."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError([ConfigProblem(str(path), "", "", f"cannot read file: {e.strerror or e}")]) from None


def decode_config_text(data: bytes | str, source: str) -> tuple[str, str]:
    """(UTF-8 text, sha256 hex digest of the bytes) of a config file's content."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        return raw.decode("utf-8"), hashlib.sha256(raw).hexdigest()
    except UnicodeDecodeError as e:
        raise ConfigError([ConfigProblem(source, "", "", f"not UTF-8 text (byte {e.start})")]) from None


def yaml_problem(source: str, doc_index: int, e: yaml.YAMLError) -> ConfigProblem:
    """A YAML syntax error as a problem naming the document, line and column."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return ConfigProblem(source, f"document {doc_index}", "", f"YAML syntax error at {where}{what}")


def load_yaml_documents(text: str, source: str, document: str = "") -> list[Any]:
    """Every document of ``text`` (None for an empty one). ``document`` names the
    enclosing document in errors (YAML nested in a ConfigMap key); by default the
    failing document's index is named."""
    docs: list[Any] = []
    try:
        for d in yaml.load_all(text, Loader=StrictLoader):
            docs.append(d)
    except yaml.YAMLError as e:
        p = yaml_problem(source, len(docs) + 1, e)
        raise ConfigError([ConfigProblem(source, document or p.document, "", p.message)]) from None
    return docs
