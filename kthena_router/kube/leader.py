"""Leader election with a coordination.k8s.io/v1 Lease (client-go's algorithm).

Every router replica watches and routes; only the Lease holder writes status.

- Acquire: create the Lease, or take it when it is free (holderIdentity empty, as a
  released Lease is) or expired. Expiry is judged on the local monotonic clock from when
  this replica last saw the Lease record change (client-go's observedTime), never by
  comparing another machine's renewTime with our wall clock.
- Renew every `retry_period` while leading; every write is a PUT carrying the Lease's
  resourceVersion, so of two replicas racing for a Lease exactly one wins (the other
  gets a 409 and stays a follower).
- Lose at once: `is_leader` turns False when a renew shows another holder, when no renew
  succeeded for `renew_deadline`, and (checked on every read, even if the loop is stuck in
  a hung request) when `renew_deadline` has passed since the last successful renew was
  sent. renew_deadline < lease_duration: we stop before anyone else may start.
- Release on shutdown: holderIdentity cleared, so a follower takes over without waiting.
- Followers retry every `retry_period` with jitter, so replicas do not move in lockstep.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = ["LeaderElector"]

log = logging.getLogger("kthena_router.kube.leader")

# The Lease goes through the generic object API: plain dicts, and our own MicroTime text.
_GROUP, _VERSION, _PLURAL = "coordination.k8s.io", "v1", "leases"
_JITTER = 0.2


def _micro_time(t: datetime) -> str:
    """metav1.MicroTime: RFC 3339 with exactly six fractional digits."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api_client: ApiClient, namespace: str, name: str, identity: str, *,
                 lease_duration: float = 15.0, renew_deadline: float = 10.0, retry_period: float = 2.0,
                 on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")
        self._api = CustomObjectsApi(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._leading = False
        self._valid_until = 0.0  # monotonic: is_leader is False from then on without a renew
        self._last_renew = 0.0  # monotonic time the last successful renew was sent
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
        self._observed_at = 0.0
        self._lease: dict[str, Any] | None = None  # the Lease as last read or written
        self._stop = asyncio.Event()
        self._release_on_stop = True
        self._task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self._leading and time.monotonic() < self._valid_until

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"lease {self.namespace}/{self.name}")
        return self._task

    async def stop(self, release: bool = True) -> None:
        """Stop campaigning; a leader gives the Lease up (release=False: as if it crashed)."""
        self._release_on_stop = release
        self._stop.set()
        if self._task is not None:
            await asyncio.shield(self._task)

    async def run(self) -> None:
        try:
            while not self._stop.is_set():
                ok = await self._try_acquire_or_renew()
                now = time.monotonic()
                if ok and not self._leading:
                    self._leading = True
                    log.info("%s: became leader (Lease %s/%s)", self.identity, self.namespace, self.name)
                    self._notify(self._on_started)
                elif not ok and self._leading and now - self._last_renew >= self.renew_deadline:
                    self._lose("could not renew the Lease within renewDeadline")
                delay = self.retry_period if self._leading else self.retry_period * (1 + _JITTER * random.random())
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        finally:
            if self._leading:
                self._lose("stopping")
                if self._release_on_stop:
                    await self._release()

    # ---- one round

    async def _try_acquire_or_renew(self) -> bool:
        sent = time.monotonic()
        now = datetime.now(timezone.utc)
        timeout = self.renew_deadline / 2
        try:
            lease = await self._api.get_namespaced_custom_object(
                _GROUP, _VERSION, self.namespace, _PLURAL, self.name, _request_timeout=timeout)
        except ApiException as e:
            if e.status != 404:
                log.warning("%s: reading Lease %s/%s: HTTP %s", self.identity, self.namespace, self.name, e.status)
                return False
            return await self._create(now, sent, timeout)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            log.warning("%s: reading Lease %s/%s: %r", self.identity, self.namespace, self.name, e)
            return False
        spec = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""), str(lease["metadata"].get("resourceVersion", "")))
        if record != self._observed:
            self._observed, self._observed_at = record, sent
        if holder and holder != self.identity:
            duration = spec.get("leaseDurationSeconds") or self.lease_duration
            if sent - self._observed_at < float(duration):
                if self._leading:
                    self._lose(f"the Lease is held by {holder}")
                return False
            log.info("%s: Lease %s/%s of %s expired; taking over", self.identity, self.namespace, self.name, holder)
        if holder != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=math.ceil(self.lease_duration),
                    renewTime=_micro_time(now))
        body = {"apiVersion": f"{_GROUP}/{_VERSION}", "kind": "Lease", "metadata": lease["metadata"], "spec": spec}
        return await self._write("writing", self._api.replace_namespaced_custom_object(
            _GROUP, _VERSION, self.namespace, _PLURAL, self.name, body, _request_timeout=timeout), sent)

    async def _create(self, now: datetime, sent: float, timeout: float) -> bool:
        body = {"apiVersion": f"{_GROUP}/{_VERSION}", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": math.ceil(self.lease_duration),
                         "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": 0}}
        return await self._write("creating", self._api.create_namespaced_custom_object(
            _GROUP, _VERSION, self.namespace, _PLURAL, body, _request_timeout=timeout), sent)

    async def _write(self, what: str, call: Awaitable[dict[str, Any]], sent: float) -> bool:
        """Await a create or replace of the Lease; True if it was written (this replica
        holds it from `sent` on)."""
        try:
            lease = await call
        except ApiException as e:
            if e.status != 409:  # 409: another replica created or wrote it first; re-read next round
                log.warning("%s: %s Lease %s/%s: HTTP %s", self.identity, what, self.namespace, self.name, e.status)
            return False
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            log.warning("%s: %s Lease %s/%s: %r", self.identity, what, self.namespace, self.name, e)
            return False
        self._renewed(lease, sent)
        return True

    def _renewed(self, lease: dict[str, Any], sent: float) -> None:
        self._lease = lease
        spec = lease.get("spec") or {}
        self._observed = (self.identity, str(spec.get("renewTime") or ""),
                          str(lease["metadata"].get("resourceVersion", "")))
        self._observed_at = sent
        self._last_renew = sent
        self._valid_until = sent + self.renew_deadline

    def _lose(self, why: str) -> None:
        self._leading = False
        self._valid_until = 0.0
        log.info("%s: no longer leader (Lease %s/%s): %s", self.identity, self.namespace, self.name, why)
        self._notify(self._on_stopped)

    @staticmethod
    def _notify(cb: Callable[[], None] | None) -> None:
        if cb is not None:
            try:
                cb()
            except Exception:
                log.exception("leader election callback failed")

    async def _release(self) -> None:
        """Clear holderIdentity (only if still ours, by resourceVersion)."""
        lease = self._lease
        if lease is None:
            return
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return
        now = _micro_time(datetime.now(timezone.utc))
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
        body = {"apiVersion": f"{_GROUP}/{_VERSION}", "kind": "Lease", "metadata": lease["metadata"], "spec": spec}
        try:
            await self._api.replace_namespaced_custom_object(
                _GROUP, _VERSION, self.namespace, _PLURAL, self.name, body, _request_timeout=self.renew_deadline / 2)
        except (ApiException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            # 409: someone else wrote the Lease since our last renew: it is not ours to clear
            log.warning("%s: releasing Lease %s/%s: %r", self.identity, self.namespace, self.name, e)
