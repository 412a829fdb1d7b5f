"""Declarations shared by several kinds: API groups, StringMatch/ModelMatch, Gateway API parent
references, status conditions."""

from __future__ import annotations

from .k8s_types import core
from .schema import Node, array, integer, map_of, obj, opt, req, string

__all__ = [
    "NETWORKING", "VERSION", "WORKLOAD", "conditions", "model_match", "parent_reference", "string_match",
]

NETWORKING = "networking.serving.volcano.sh"
WORKLOAD = "workload.serving.volcano.sh"
VERSION = "v1alpha1"

_DNS_SUBDOMAIN = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def string_match(description: str) -> Node:
    """One of exact / prefix / regex (the parsers require exactly one)."""
    return obj(description,
               opt("exact", string("Matches when the value equals this string.")),
               opt("prefix", string("Matches when the value starts with this string.")),
               opt("regex", string("Matches when this regular expression matches the value.")))


def model_match() -> Node:
    return obj(
        "Conditions a request must meet for the rule to apply; all present conditions must hold, "
        "and an empty match accepts every request.",
        opt("headers", map_of(string_match("How the header's value is matched."),
                              "Request headers to match, by header name.")),
        opt("uri", string_match("How the request path is matched.")),
        opt("body", obj("Conditions on the request body.",
                        opt("model", string("The body's \"model\" must equal this (a model or LoRA adapter name)."))))
    )


def parent_reference() -> Node:
    """A Gateway API ParentReference (gateway.networking.k8s.io/v1)."""
    return obj(
        "A Gateway (or other parent) this route attaches to.",
        opt("group", string("Group of the parent resource.", default="gateway.networking.k8s.io", max_length=253,
                            pattern=_DNS_SUBDOMAIN)),
        opt("kind", string("Kind of the parent resource.", default="Gateway", min_length=1, max_length=63,
                           pattern=r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")),
        opt("namespace", string("Namespace of the parent; the route's own namespace when unset.", min_length=1,
                                max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")),
        req("name", string("Name of the parent resource.", min_length=1, max_length=253)),
        opt("sectionName", string("A section (listener) of the parent.", min_length=1, max_length=253,
                                  pattern=_DNS_SUBDOMAIN[4:])),
        opt("port", integer("A port of the parent.", minimum=1, maximum=65535)),
    )


def conditions(description: str, *, keyed: bool = False) -> Node:
    """metav1.Condition list; ``keyed``: one condition per type (listType map)."""
    items = core("meta.Condition")
    if keyed:
        return array(items, description, list_type="map", list_map_keys=("type",))
    return array(items, description)


def observed_generation() -> Node:
    return integer("The .metadata.generation the controller last acted on.", format="int64")
