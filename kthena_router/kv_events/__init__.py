"""KV-cache events from the engines (vLLM format) -> exact block ownership per endpoint."""

from .hashing import BlockHasher, fold_hash
from .ownership import OwnershipTable
from .subscriber import (
    EndpointSubscriber,
    EventSource,
    KvEventSubscribers,
    OwnershipSink,
    StreamState,
    StreamStatus,
    gauge_status_hook,
)
from .wire import Batch, Cleared, DecodeError, Removed, Stored, decode_batch

__all__ = [
    "Batch", "BlockHasher", "Cleared", "DecodeError", "EndpointSubscriber", "EventSource",
    "KvEventSubscribers", "OwnershipSink", "OwnershipTable", "Removed", "StreamState",
    "StreamStatus", "Stored", "decode_batch", "fold_hash", "gauge_status_hook",
]
