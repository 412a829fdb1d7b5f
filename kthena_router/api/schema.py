"""Typed declarations of Kthena's API fields: the one source of the CRDs and of the parsers' rules.

A ``Node`` is one OpenAPI v3 schema node (type, bounds, enum, default, CEL rules, children);
``Field`` names a child of an object node. ``to_openapi`` turns a node into the structural
schema a CRD carries. Nothing here imports the router's runtime: the controller and the
router both read these declarations (docs/crds.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AGE", "Column", "Field", "Kind", "Scale", "Node", "Rule", "UNSET", "array", "boolean", "duration", "fields", "int_or_string", "integer",
    "iter_nodes", "json_any", "map_of", "node_at", "obj", "opt", "quantity", "raw", "req", "string",
    "to_openapi",
]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()

# Kubernetes' resource.Quantity syntax (as the apiserver checks it)
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


@dataclass(frozen=True)
class Rule:
    """A CEL rule (``x-kubernetes-validations``) and the message the apiserver returns."""

    rule: str
    message: str


@dataclass(frozen=True)
class Field:
    """A property of an object node. ``crd=False``: accepted by the router's file mode only
    (a Kthena proposal its CRD does not carry yet); never written into a CRD."""

    name: str
    node: Node
    required: bool = False
    crd: bool = True


@dataclass(frozen=True)
class Node:
    type: str | None = None  # string | integer | number | boolean | object | array | None (int-or-string, any)
    description: str = ""
    format: str | None = None
    enum: tuple[Any, ...] = ()
    default: Any = UNSET
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    min_items: int | None = None
    max_items: int | None = None
    min_properties: int | None = None
    max_properties: int | None = None
    properties: tuple[Field, ...] = ()
    items: Node | None = None
    values: Node | None = None  # additionalProperties: a map's values
    rules: tuple[Rule, ...] = ()
    int_or_string: bool = False
    preserve_unknown: bool = False
    list_type: str | None = None
    list_map_keys: tuple[str, ...] = ()
    map_type: str | None = None
    openapi: Mapping[str, Any] | None = None  # a ready structural schema (Kubernetes' own types)

    def field(self, name: str) -> Field:
        for f in self.properties:
            if f.name == name:
                return f
        raise KeyError(name)

    def known(self, *, crd_only: bool = False) -> tuple[str, ...]:
        """Property names, in declaration order (the parsers' known keys)."""
        return tuple(f.name for f in self.properties if f.crd or not crd_only)

    def required(self, *, crd_only: bool = False) -> tuple[str, ...]:
        return tuple(f.name for f in self.properties if f.required and (f.crd or not crd_only))


# --- constructors --------------------------------------------------------------------------
def string(description: str = "", *, enum: tuple[str, ...] = (), default: Any = UNSET, pattern: str | None = None,
           min_length: int | None = None, max_length: int | None = None, format: str | None = None,
           rules: tuple[Rule, ...] = ()) -> Node:
    return Node("string", description, format=format, enum=enum, default=default, pattern=pattern,
                min_length=min_length, max_length=max_length, rules=rules)


def integer(description: str = "", *, format: str | None = "int32", minimum: int | None = None,
            maximum: int | None = None, default: Any = UNSET) -> Node:
    return Node("integer", description, format=format, minimum=minimum, maximum=maximum, default=default)


def boolean(description: str = "", *, default: Any = UNSET) -> Node:
    return Node("boolean", description, default=default)


def duration(description: str = "", *, default: Any = UNSET) -> Node:
    """A Go duration string ("100ms", "1m30s"), as metav1.Duration is published."""
    return Node("string", description, default=default)


def int_or_string(description: str = "", *, default: Any = UNSET) -> Node:
    return Node(None, description, default=default, int_or_string=True)


def quantity(description: str = "") -> Node:
    return Node(None, description, pattern=QUANTITY_PATTERN, int_or_string=True)


def json_any(description: str = "") -> Node:
    """Free-form JSON (apiextensions JSON): the one place unknown fields are kept."""
    return Node(None, description, preserve_unknown=True)


def obj(description: str, *props: Field, rules: tuple[Rule, ...] = (), min_properties: int | None = None,
        max_properties: int | None = None, map_type: str | None = None) -> Node:
    return Node("object", description, properties=props, rules=rules, min_properties=min_properties,
                max_properties=max_properties, map_type=map_type)


def array(items: Node, description: str = "", *, min_items: int | None = None, max_items: int | None = None,
          list_type: str | None = None, list_map_keys: tuple[str, ...] = (), rules: tuple[Rule, ...] = ()) -> Node:
    return Node("array", description, items=items, min_items=min_items, max_items=max_items, list_type=list_type,
                list_map_keys=list_map_keys, rules=rules)


def map_of(values: Node, description: str = "", *, min_properties: int | None = None,
           max_properties: int | None = None, rules: tuple[Rule, ...] = ()) -> Node:
    return Node("object", description, values=values, min_properties=min_properties,
                max_properties=max_properties, rules=rules)


def raw(schema: Mapping[str, Any], description: str = "") -> Node:
    return Node(schema.get("type"), description, openapi=schema)


def opt(name: str, node: Node) -> Field:
    return Field(name, node)


def req(name: str, node: Node) -> Field:
    return Field(name, node, required=True)


def fields(*fs: Field) -> tuple[Field, ...]:
    return fs


# --- walking -------------------------------------------------------------------------------
def iter_nodes(node: Node, path: str = "", *, crd_only: bool = False) -> Iterator[tuple[str, Node]]:
    """(path, node) for a node and everything below it; list items as ``[]``, map values as ``{}``.
    Nodes given as ready OpenAPI (Kubernetes' types) are yielded but not entered."""
    yield path, node
    for f in node.properties:
        if f.crd or not crd_only:
            yield from iter_nodes(f.node, f"{path}.{f.name}" if path else f.name, crd_only=crd_only)
    if node.items is not None:
        yield from iter_nodes(node.items, path + "[]", crd_only=crd_only)
    if node.values is not None:
        yield from iter_nodes(node.values, path + "{}", crd_only=crd_only)


def node_at(node: Node, path: str) -> Node:
    for p, n in iter_nodes(node):
        if p == path:
            return n
    raise KeyError(path)


# --- OpenAPI -------------------------------------------------------------------------------
def to_openapi(node: Node) -> dict[str, Any]:
    """The structural schema of a node (CRD fields only)."""
    if node.openapi is not None:
        out = dict(node.openapi)
        if node.description:
            out["description"] = node.description
        return out
    out: dict[str, Any] = {}
    if node.description:
        out["description"] = node.description
    if node.int_or_string:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        out["x-kubernetes-int-or-string"] = True
    elif node.type is not None:
        out["type"] = node.type
    if node.preserve_unknown:
        out["x-kubernetes-preserve-unknown-fields"] = True
    for key, val in (("format", node.format), ("minimum", node.minimum), ("maximum", node.maximum),
                     ("minLength", node.min_length), ("maxLength", node.max_length), ("pattern", node.pattern),
                     ("minItems", node.min_items), ("maxItems", node.max_items),
                     ("minProperties", node.min_properties), ("maxProperties", node.max_properties),
                     ("x-kubernetes-list-type", node.list_type), ("x-kubernetes-map-type", node.map_type)):
        if val is not None:
            out[key] = val
    if node.enum:
        out["enum"] = list(node.enum)
    if node.default is not UNSET:
        out["default"] = node.default
    if node.list_map_keys:
        out["x-kubernetes-list-map-keys"] = list(node.list_map_keys)
    props = [f for f in node.properties if f.crd]
    if props:
        out["properties"] = {f.name: to_openapi(f.node) for f in props}
        required = [f.name for f in props if f.required]
        if required:
            out["required"] = required
    if node.items is not None:
        out["items"] = to_openapi(node.items)
    if node.values is not None:
        out["additionalProperties"] = to_openapi(node.values)
    if node.rules:
        out["x-kubernetes-validations"] = [{"message": r.message, "rule": r.rule} for r in node.rules]
    return out


@dataclass(frozen=True)
class Column:
    """An ``additionalPrinterColumns`` entry (kubectl get)."""

    name: str
    type: str
    json_path: str
    description: str = ""

    def to_openapi(self) -> dict[str, Any]:
        out = {"jsonPath": self.json_path, "name": self.name, "type": self.type}
        if self.description:
            out["description"] = self.description
        return out


AGE = Column("Age", "date", ".metadata.creationTimestamp")


@dataclass(frozen=True)
class Scale:
    spec_replicas: str
    status_replicas: str
    label_selector: str | None = None


@dataclass(frozen=True)
class Kind:
    """One API kind: group/version/names, spec and status schemas, kubectl columns, subresources."""

    group: str
    version: str
    kind: str
    plural: str
    description: str
    spec: Node
    status: Node
    spec_required: bool = False
    columns: tuple[Column, ...] = (AGE,)
    scale: Scale | None = None
    short_names: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    def crd(self) -> dict[str, Any]:
        root: dict[str, Any] = {
            "description": self.description,
            "type": "object",
            "properties": {
                "apiVersion": {"description": "The versioned schema of this object (group/version).", "type": "string"},
                "kind": {"description": "The REST resource this object represents.", "type": "string"},
                "metadata": {"type": "object"},
                "spec": to_openapi(self.spec),
                "status": to_openapi(self.status),
            },
        }
        if self.spec_required:
            root["required"] = ["spec"]
        subresources: dict[str, Any] = {"status": {}}
        if self.scale is not None:
            sc = {"specReplicasPath": self.scale.spec_replicas, "statusReplicasPath": self.scale.status_replicas}
            if self.scale.label_selector:
                sc["labelSelectorPath"] = self.scale.label_selector
            subresources["scale"] = sc
        names: dict[str, Any] = {"kind": self.kind, "listKind": self.kind + "List", "plural": self.plural,
                                 "singular": self.singular}
        if self.short_names:
            names["shortNames"] = list(self.short_names)
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": self.crd_name},
            "spec": {
                "group": self.group,
                "names": names,
                "scope": "Namespaced",
                "versions": [{
                    "additionalPrinterColumns": [c.to_openapi() for c in self.columns],
                    "name": self.version,
                    "schema": {"openAPIV3Schema": root},
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                }],
            },
        }
