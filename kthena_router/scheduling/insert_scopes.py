"""Which scheduler a shared dispatch-time insert belongs to.

A worker holds several approximate prefix indexes: the plain scheduler's and, with
prefill/decode disaggregation, the PD pairer's decode-side and prefill-side schedulers
(pd/pairing.py). Their inserts are shared the same way (pod-state hub, podstate/; Redis
sharedPrefixIndex, shared_index/), so each record names its index: the endpoint key
("ip:port") for the plain scheduler, `<scope>\\x00<endpoint key>` for a PD side. Scoped
records stay opaque to the hub and to Redis (they relay bytes), and a router that does
not know a scope finds no endpoint of that name and skips the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kthena_router._core import BlockHashes

__all__ = ["PD_DECODE", "PD_PREFILL", "SEP", "InsertTargets", "Listener", "scoped", "split"]

SEP = "\x00"  # never in an endpoint key
PD_DECODE = "pd-decode"
PD_PREFILL = "pd-prefill"

Listener = Callable[[str, BlockHashes], None]


def scoped(scope: str, listener: Listener) -> Listener:
    """`listener` with its endpoint keys prefixed by `scope` ("" = unchanged)."""
    if not scope:
        return listener
    prefix = scope + SEP

    def send(key: str, hashes: BlockHashes) -> None:
        listener(prefix + key, hashes)

    return send


def split(key: str) -> tuple[str, str]:
    """(scope, endpoint key) of a record's key."""
    scope, sep, ep_key = key.partition(SEP)
    return (scope, ep_key) if sep else ("", key)


class InsertTargets:
    """Applies shared records to this worker's indexes: the live plain scheduler and, by
    scope, the live PD side schedulers (each re-read per record: reloads swap them)."""

    def __init__(self, plain: Callable[[], Any], pd: Callable[[], Any] = lambda: None) -> None:
        self._plain = plain
        self._pd = pd

    def scheduler(self, scope: str) -> Any:
        if not scope:
            return self._plain()
        pairer = self._pd()
        if pairer is None:
            return None
        if scope == PD_DECODE:
            return pairer.decode.inner
        if scope == PD_PREFILL:
            return pairer.prefill.inner
        return None

    def insert(self, key: str, hashes: BlockHashes) -> bool:
        """Insert one record; False if no index of this worker knows its endpoint."""
        scope, ep_key = split(key)
        sched = self.scheduler(scope)
        if sched is None:
            return False
        ep_id = sched.endpoint_id(ep_key)
        if ep_id is None:
            return False
        sched.index.insert(ep_id, hashes)
        return True
