"""Cached label children of prometheus_client metric families, for the metric helpers of
the request path (fairness, rate limits, PD): `family.labels(...)` validates the values and
takes the family's lock on every call; a dict lookup per observation does not."""

from __future__ import annotations

from typing import Any

__all__ = ["LabelChildren"]


class LabelChildren:
    """`children(family, *labels)`: the family's child for these label values, made once."""

    __slots__ = ("_children",)

    def __init__(self) -> None:
        self._children: dict[tuple[Any, ...], Any] = {}

    def __call__(self, family: Any, *labels: str) -> Any:
        key = (id(family), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child
