"""Which endpoint holds which KV block, from the engines' events (pure-Python reference).

The Rust `KvOwnershipTable` is meant to replace this; both implement `OwnershipSink`
(subscriber.py) plus `match`. Hashes are the 64-bit ints of vLLM's events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class OwnershipTable:
    def __init__(self) -> None:
        self._blocks: dict[str, dict[int, int]] = {}  # endpoint -> hash -> count
        self._owners: dict[int, set[str]] = {}
        self._up: dict[str, bool] = {}

    # --- OwnershipSink --------------------------------------------------------------
    def stored(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        mine = self._blocks.setdefault(endpoint_id, {})
        owners = self._owners
        for h in hashes:
            n = mine.get(h, 0)
            mine[h] = n + 1
            if n == 0:
                o = owners.get(h)
                if o is None:
                    owners[h] = {endpoint_id}
                else:
                    o.add(endpoint_id)

    def removed(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        mine = self._blocks.get(endpoint_id)
        if not mine:
            return
        for h in hashes:
            n = mine.get(h)
            if n is None:
                continue
            if n > 1:
                mine[h] = n - 1
            else:
                del mine[h]
                self._drop_owner(h, endpoint_id)

    def cleared(self, endpoint_id: str) -> None:
        mine = self._blocks.pop(endpoint_id, None)
        for h in mine or ():
            self._drop_owner(h, endpoint_id)

    def set_stream_up(self, endpoint_id: str, up: bool) -> None:
        self._up[endpoint_id] = up

    # --- queries --------------------------------------------------------------------
    def is_up(self, endpoint_id: str) -> bool:
        return self._up.get(endpoint_id, False)

    def blocks(self, endpoint_id: str) -> frozenset[int]:
        return frozenset(self._blocks.get(endpoint_id, ()))

    def num_entries(self) -> int:
        return sum(len(m) for m in self._blocks.values())

    def match(self, endpoint_ids: Iterable[str], hashes: Sequence[int]) -> dict[str, int]:
        """Per endpoint: how many leading blocks of `hashes` it holds (its cached prefix)."""
        out = dict.fromkeys(endpoint_ids, 0)
        alive = set(out)
        owners = self._owners
        n = 0
        for h in hashes:
            o = owners.get(h)
            if o is None:
                break
            still = alive & o
            if len(still) != len(alive):
                for e in alive - still:
                    out[e] = n
                alive = still
                if not alive:
                    return out
            n += 1
        for e in alive:
            out[e] = n
        return out

    def remove_endpoint(self, endpoint_id: str) -> None:
        self.cleared(endpoint_id)
        self._up.pop(endpoint_id, None)

    def _drop_owner(self, h: int, endpoint_id: str) -> None:
        o = self._owners.get(h)
        if o is not None:
            o.discard(endpoint_id)
            if not o:
                del self._owners[h]
