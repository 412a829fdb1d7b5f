"""`maxInFlightPerEndpoint: auto`: each engine's batch capacity, learned from scrapes.

An engine's capacity is the number of requests it runs before it queues (vLLM/SGLang's
`running` while `waiting` > 0). One scrape showing a waiting request is weak evidence: at
any load a request that arrived during a step waits for the next one, so a scrape taken
then shows `waiting` >= 1 at a running count far below capacity. Learning from such a
scrape alone and never revising upwards starves the engines: the router then never lets
them run more than that count, so they never show that they could. Hence, per endpoint:

- first scrape with waiting requests: capacity = running (something to start from);
- waiting requests on two fresh scrapes in a row (the engine really queues): capacity =
  running, down or up; the endpoint is then `settled`;
- running above the learned capacity with nothing waiting (the router's one-request
  headroom, or other routers' traffic, went through): the engine can take more. Before
  the endpoint has settled, capacity doubles from that running count (a value learned from
  a passing queue recovers in a few scrapes); once settled, it grows by an eighth, so it
  follows a slowly rising capacity without overshooting a known one by much.

An overshoot costs what running without the limit costs (a queue in the engine), and the
next two scrapes that show it bring the capacity back down.
"""

from __future__ import annotations

__all__ = ["CapacityLearner"]


class CapacityLearner:
    """Learned batch capacity per endpoint key; pure logic, fed by `observe`."""

    __slots__ = ("capacity", "settled", "_prev_waiting")

    def __init__(self) -> None:
        self.capacity: dict[str, int] = {}
        self.settled: set[str] = set()
        self._prev_waiting: dict[str, bool] = {}

    def observe(self, key: str, running: int | None, waiting: int | None) -> None:
        """One scrape of one endpoint; None values are a stale or failed scrape."""
        if running is None or waiting is None:
            self._prev_waiting.pop(key, None)
            return
        queued = waiting > 0
        was_queued = self._prev_waiting.get(key, False)
        self._prev_waiting[key] = queued
        if running <= 0:
            return
        cap = self.capacity.get(key)
        if queued:
            if cap is None or was_queued or running > cap:
                self.capacity[key] = running
            if was_queued:
                self.settled.add(key)
        elif cap is not None and running > cap:
            self.capacity[key] = running + (running // 8 or 1) if key in self.settled else 2 * running

    def get(self, key: str) -> int | None:
        return self.capacity.get(key)

    def forget(self, live: set[str]) -> None:
        for key in [k for k in self.capacity if k not in live]:
            del self.capacity[key]
        for key in [k for k in self._prev_waiting if k not in live]:
            del self._prev_waiting[key]
        self.settled &= live
