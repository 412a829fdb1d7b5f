"""The prometheus label children a fast-path request's end writes, per label set.

`FastPath.done` writes up to eight children (requests, duration, TTFT, TPOT, tokens and
endpoint tokens in and out) whose labels are the same for every request of one (model,
path, route, server, endpoint, status, error type). `RouterMetrics._child` finds each one
by building its label tuple; here the set is found once per request. A child is created
only when first written (as `_child` would: creating one adds its series to the export).

`RouterMetrics.prune_endpoints` drops children of gone endpoints; its `generation` changes
then and this cache starts over, so no write goes to a dropped child (in multiprocess
mode two live children of one series would overwrite each other's file value).
"""

from __future__ import annotations

from typing import Any

from kthena_router.metrics import RouterMetrics

ReportKey = tuple[str, str, str, str, str, int, str]  # model, path, route, server, endpoint, status, error type


class ReportChildren:
    __slots__ = ("metrics", "key", "requests", "duration", "signals", "_ttft", "_tpot", "_tokens")

    def __init__(self, metrics: RouterMetrics, key: ReportKey) -> None:
        model, path, route, server, endpoint, status, error_type = key
        code = str(status)
        self.metrics = metrics
        self.key = key
        child = metrics._child
        self.requests = child(metrics.requests, (model, path, code, error_type, route, server, endpoint))
        self.duration = child(metrics.duration, (model, path, code))
        self.signals = False  # the endpoint token family is registered
        self._ttft: Any = None
        self._tpot: Any = None
        self._tokens: dict[str, tuple[Any, Any]] = {}

    def ttft(self) -> Any:
        if self._ttft is None:
            self._ttft = self.metrics._child(self.metrics.ttft, self.key[:2])
        return self._ttft

    def tpot(self) -> Any:
        if self._tpot is None:
            self._tpot = self.metrics._child(self.metrics.tpot, self.key[:2])
        return self._tpot

    def tokens(self, kind: str) -> tuple[Any, Any]:
        """(tokens by model and path, tokens by server and endpoint) of `kind` (input|output)."""
        pair = self._tokens.get(kind)
        if pair is None:
            m = self.metrics
            model, path, _, server, endpoint, _, _ = self.key
            pair = self._tokens[kind] = (m._child(m.tokens, (model, path, kind)),
                                         m._child(m._signal_families()[0], (server, endpoint, kind)))
        return pair


class ReportCache:
    """ReportChildren by label set, for the current metrics generation."""

    __slots__ = ("metrics", "generation", "sets")

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        self.generation = metrics.generation
        self.sets: dict[ReportKey, ReportChildren] = {}

    def get(self, key: ReportKey) -> ReportChildren:
        if self.generation != self.metrics.generation:
            self.generation = self.metrics.generation
            self.sets = {}
        found = self.sets.get(key)
        if found is None:
            found = self.sets[key] = ReportChildren(self.metrics, key)
        return found
