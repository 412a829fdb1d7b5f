"""Which engine stored a Responses API response (per worker, bounded LRU).

vLLM keeps a response in the memory of the engine that produced it, so a follow-up
(`previous_response_id`) and `GET /v1/responses/{id}` must reach that engine. The id is
recorded from the non-streamed body and from the streamed `response.created` /
terminal events. An id this worker has not seen (another worker produced it, or it was
evicted) is refused with a 404 rather than sent to an engine that cannot know it.
Shared state across workers is a later step (docs/architecture.md).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple


class StoredAt(NamedTuple):
    endpoint: str  # EndpointState.key
    model: str     # the model name the client used (routes the follow-ups)


class ResponseIds:
    __slots__ = ("limit", "_items")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[str, StoredAt] = OrderedDict()

    def put(self, response_id: str, at: StoredAt) -> None:
        items = self._items
        items[response_id] = at
        items.move_to_end(response_id)
        if len(items) > self.limit:
            items.popitem(last=False)

    def get(self, response_id: str) -> StoredAt | None:
        at = self._items.get(response_id)
        if at is not None:
            self._items.move_to_end(response_id)
        return at

    def __len__(self) -> int:
        return len(self._items)
