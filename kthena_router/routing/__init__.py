"""Request routing: model name + path + headers -> route rule and weighted target."""

from .table import RouteMatch, RouteNotFound, RouteTable

__all__ = ["RouteMatch", "RouteNotFound", "RouteTable"]
