"""Routing by a stored Responses API id (see response_ids.py for why)."""

from __future__ import annotations

from typing import Any

from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError
from kthena_router.proxy.response_ids import ResponseIds, StoredAt


def stored_at(ids: ResponseIds, response_id: Any, param: str) -> StoredAt:
    """Where `response_id` was stored; 404 naming `param` when this worker does not know it."""
    if type(response_id) is not str or not response_id:
        raise RequestError(400, f"'{param}' must be a non-empty string", param=param)
    at = ids.get(response_id)
    if at is None:
        raise RequestError(404, f"Response with id '{response_id}' not found: this router does not know "
                                "which engine stored it (unknown, expired from the router's memory, or "
                                "created through another router worker)", type_="invalid_request_error",
                           param=param)
    return at


def pinned_endpoint(targets: tuple[EndpointState, ...], at: StoredAt, response_id: str,
                    param: str) -> EndpointState:
    """The route's endpoint that holds the response (404 if it left the route)."""
    for ep in targets:
        if ep.key == at.endpoint:
            return ep
    raise RequestError(404, f"Response with id '{response_id}' not found: the engine that stored it "
                            "no longer serves this route", type_="invalid_request_error", param=param)
