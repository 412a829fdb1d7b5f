"""The autoscaler controller: one periodic round per AutoscalingPolicy (Kthena evaluates every
15 s), run by controller.manager.Manager under the same Lease as the other controllers.

- An informer of AutoscalingPolicies (its own queue); the ModelServings and pods come from
  the ModelServing controller's caches (controller.informers.Informers).
- Level-triggered: a new policy, or a spec change (generation), queues a round at once;
  every round ends with `add_after(period)` for the next. Status writes (which change the
  policy's resourceVersion, not its generation) do not trigger rounds.
- Per policy, in memory, the algorithm's state (ScalerState: history, panic mode), rebuilt
  when the policy's uid or generation changes (Kthena's NeedUpdate). A restart starts
  with empty histories, as Kthena's.
- A round: parse the spec (PolicyError -> Ready False, InvalidPolicy), find the target
  (TargetFound), collect metrics (collector.py), run the algorithm, write the replicas
  only when they change (targets.py), then the status (status.py) when it changed.
- Dry run: the decision is logged and written to the status (Ready reason DryRun, message
  "dry run: would scale ..."); the replicas are not written.
- Routers (`--router-metrics-url`): `router:` policy metrics are read from their pages, and
  every unit gets the wake signal `router:pending_requests` (router_metrics.py), the
  requests the routers hold for the ModelServers (a small informer) that select the
  target's pods. Without routers the wake signal is missing: minReplicas 0 never brings a
  target down to zero (it could not come back).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from controller import mergepatch
from controller import naming as n
from controller.informers import Informers
from controller.kubeapi import Conflict, Writer, object_path
from controller.workqueue import WorkQueue, run_worker
from kthena_router.api.autoscalingpolicy import AUTOSCALING_POLICY
from kthena_router.api.modelserver import MODEL_SERVER
from kthena_router.api.modelserving import MODEL_SERVING
from kthena_router.kube.client import ApiError, KubeApi
from kthena_router.kube.reflector import Reflector, Resource

from .collector import Collector
from .disaggregated import recommend_disaggregated
from .heterogeneous import recommend_heterogeneous
from .metrics import Observation
from .policy import Policy, PolicyError, parse_policy
from .recommend import ScalerState, Wake, recommend_homogeneous
from .router_metrics import WAKE_METRIC, router_metric_error, selecting_servers, woken
from .router_source import RouterSource
from .status import Round, Scaled, desired_status
from .targets import TargetError, current_replicas, role_replicas, roles_patch, scale_patch

__all__ = ["AutoscalerController", "PERIOD_S"]

log = logging.getLogger(__name__)

Key = tuple[str, str]
Obj = dict[str, Any]

PERIOD_S = 15.0  # Kthena's AutoscalingSyncPeriodSeconds
# Every unit has the wake signal; it is missing without routers (then never down to zero)
WAKE = Wake(WAKE_METRIC)
RETRY_CONFLICT_S = 1.0  # a role patch refused because the ModelServing changed: look again soon
_MAX_MESSAGE = 1000


@dataclass
class _PolicyState:
    uid: str
    generation: int
    homogeneous: ScalerState = field(default_factory=ScalerState)
    heterogeneous: ScalerState = field(default_factory=ScalerState)
    roles: dict[str, ScalerState] = field(default_factory=dict)


class _WriteFailed(Exception):
    def __init__(self, message: str, retry: float | None) -> None:
        super().__init__(message)
        self.retry = retry


def _path(namespace: str, api_version: str, plural: str) -> str:
    base = f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


class AutoscalerController:
    def __init__(self, api: KubeApi, namespace: str, writer: Writer, informers: Informers, *,
                 dry_run: bool = False, period_s: float = PERIOD_S, scrape_timeout_s: float = 3.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 watch_timeout_s: float = 300.0, router_urls: tuple[str, ...] = ()) -> None:
        self.writer = writer
        self.informers = informers
        self.dry_run = dry_run
        self.period = max(0.1, period_s)
        self.clock = clock
        self.queue: WorkQueue[Key] = WorkQueue()
        # one router fetch serves every round within a quarter period; rates span >= half a period
        router = (RouterSource(router_urls, min_interval_s=min(1.0, self.period / 4), min_rate_s=self.period / 2,
                               clock=lambda: asyncio.get_running_loop().time())
                  if router_urls else None)
        self.collector = Collector(scrape_timeout_s, router)
        self.servers: Reflector | None = None  # ModelServers, only with routers (the wake signal)
        if router_urls:
            self.servers = Reflector(
                api, Resource("modelservers", _path(namespace, MODEL_SERVER.api_version, MODEL_SERVER.plural), {}),
                lambda: None, lambda resource, reason: log.debug("informer %s: %s", resource, reason),
                watch_timeout_s=watch_timeout_s)
        self.policies = Reflector(
            api, Resource("autoscalingpolicies", _path(namespace, AUTOSCALING_POLICY.api_version,
                                                         AUTOSCALING_POLICY.plural), {}),
            lambda: None, lambda resource, reason: log.debug("informer %s: %s", resource, reason),
            watch_timeout_s=watch_timeout_s, on_object=self._event)
        self.states: dict[Key, _PolicyState] = {}
        self._written: dict[Key, tuple[str, Obj]] = {}  # own status writes the watch has not shown yet

    # --- wiring -----------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        return self.policies.synced and (self.servers is None or self.servers.synced)

    def run_informers(self) -> asyncio.Task[None]:
        async def run() -> None:
            await asyncio.gather(self.policies.run(), *([self.servers.run()] if self.servers is not None else []))
        return asyncio.create_task(run(), name="autoscaler informers")

    def start_workers(self, workers: int) -> list[asyncio.Task[None]]:
        for key in list(self.policies.store):
            self.queue.add(key)
        return [asyncio.create_task(run_worker(self.queue, self.reconcile), name=f"autoscaler worker {i}")
                for i in range(max(1, workers))]

    async def stop(self) -> None:
        self.queue.shut_down()
        await self.collector.close()

    def _event(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            self.states.pop(key, None)
            self._written.pop(key, None)
            return
        om, nm = (old or {}).get("metadata") or {}, new.get("metadata") or {}
        if old is None or om.get("uid") != nm.get("uid") or om.get("generation") != nm.get("generation"):
            self.queue.add(key)

    # --- one round ----------------------------------------------------------------------------
    def _policy(self, key: Key) -> Obj | None:
        cached = self.policies.store.get(key)
        own = self._written.get(key)
        if cached is None or own is None:
            return cached
        if own[0] == cached["metadata"].get("resourceVersion") and \
                own[1]["metadata"].get("uid") == cached["metadata"].get("uid"):
            return own[1]
        del self._written[key]
        return cached

    def _state(self, key: Key, obj: Obj) -> _PolicyState:
        meta = obj["metadata"]
        uid, gen = str(meta.get("uid") or ""), int(meta.get("generation") or 0)
        st = self.states.get(key)
        if st is None or st.uid != uid or st.generation != gen:
            if st is not None:
                log.info("%s/%s: policy changed (generation %d): scaling history reset", key[0], key[1], gen)
            st = self.states[key] = _PolicyState(uid, gen)
        return st

    async def reconcile(self, key: Key) -> float | None:
        obj = self._policy(key)
        if obj is None:
            self.states.pop(key, None)
            return None
        if obj["metadata"].get("deletionTimestamp"):
            return None
        state = self._state(key, obj)
        again: float | None = self.period
        try:
            policy = parse_policy(obj.get("spec") or {})
            self._check_router_metrics(obj.get("spec") or {}, policy)
        except PolicyError as exc:
            rnd = Round(False, "InvalidPolicy", str(exc), None)
        else:
            try:
                rnd = await self._round(key, obj, policy, state)
            except _WriteFailed as exc:
                rnd = Round(False, "ScaleFailed", str(exc), True)
                again = exc.retry or self.period
        await self._write_status(key, obj, rnd)
        return again

    async def _round(self, key: Key, obj: Obj, policy: Policy, state: _PolicyState) -> Round:
        spec = obj.get("spec") or {}
        now = asyncio.get_running_loop().time()
        if policy.homogeneous is not None:
            return await self._homogeneous(key, spec, policy, state, now)
        if policy.heterogeneous is not None:
            return await self._heterogeneous(key, spec, policy, state, now)
        return await self._disaggregated(key, spec, policy, state, now)

    def _check_router_metrics(self, spec: Obj, policy: Policy) -> None:
        """PolicyError for router: metrics this controller cannot read (router_metrics.py)."""
        configured = self.collector.router is not None
        checks: list[tuple[object, object, str]] = []
        if policy.homogeneous is not None:
            t = (spec.get("homogeneousTarget") or {}).get("target") or {}
            checks.append((policy.metrics, t.get("metricSources"), "spec.homogeneousTarget"))
        if policy.heterogeneous is not None:
            for i, raw in enumerate((spec.get("heterogeneousTarget") or {}).get("params") or []):
                checks.append((policy.metrics, ((raw or {}).get("target") or {}).get("metricSources"),
                               f"spec.heterogeneousTarget.params[{i}]"))
        if policy.disaggregated is not None:
            raw_roles = (spec.get("disaggregatedTarget") or {}).get("roles") or {}
            for role, param in sorted(policy.disaggregated.roles.items()):
                checks.append((param.metrics if not param.fixed else {},
                               (raw_roles.get(role) or {}).get("metricSources"),
                               f"spec.disaggregatedTarget.roles.{role}"))
        for metrics, sources, where in checks:
            error = router_metric_error(metrics, sources, where, configured)  # type: ignore[arg-type]
            if error:
                raise PolicyError(error)

    async def _woken(self, ns: str, ms: Obj, obs: Observation) -> Observation:
        """`obs` with the wake signal: the pending requests of the ModelServers that select
        this ModelServing's pods (absent without routers, or when not known)."""
        if self.servers is None:
            return obs
        snapshot = await self.collector.router_snapshot()
        name = (ms.get("metadata") or {}).get("name")
        own = [p for p in self._pods() if (p.get("metadata") or {}).get("namespace") == ns
               and ((p.get("metadata") or {}).get("labels") or {}).get(n.LABEL_NAME) == name
               and ((p.get("metadata") or {}).get("labels") or {}).get(n.LABEL_ENTRY) == n.ENTRY]
        return woken(obs, snapshot, selecting_servers(self.servers.store.values(), ns, ms, own))

    def _target(self, namespace: str, name: str) -> Obj | None:
        ms = self.informers.modelserving((namespace, name))
        if ms is None or (ms.get("metadata") or {}).get("deletionTimestamp"):
            return None
        return ms

    def _pods(self) -> list[Obj]:
        return list(self.informers.pods.store.values())

    def _verdict(self, key: Key, what: str, current: int, replicas: int, reason: str, skipped: bool) -> tuple[str, str]:
        """(Ready reason, message) of a decision, logged."""
        if skipped:
            return "Reconciled", f"no scaling this round: {reason}"
        if replicas == current:
            return "Reconciled", f"{what}: {current} replicas kept ({reason})"
        if self.dry_run:
            log.info("%s/%s: dry run: would scale %s %d -> %d (%s)", key[0], key[1], what, current, replicas, reason)
            return "DryRun", f"dry run: would scale {what} {current} -> {replicas} ({reason})"
        log.info("%s/%s: scaling %s %d -> %d (%s)", key[0], key[1], what, current, replicas, reason)
        return "Reconciled", f"scaled {what} {current} -> {replicas} ({reason})"

    async def _scale(self, namespace: str, name: str, replicas: int) -> None:
        path = object_path(MODEL_SERVING.api_version, MODEL_SERVING.plural, namespace, name) + "/scale"
        try:
            await self.writer.merge_patch(path, scale_patch(replicas))
        except Conflict as exc:  # 404: the ModelServing went meanwhile
            raise _WriteFailed(f"scaling ModelServing {namespace}/{name} failed: {exc}", RETRY_CONFLICT_S) from None
        except ApiError as exc:
            raise _WriteFailed(f"scaling ModelServing {namespace}/{name} failed: {exc}", None) from None

    async def _homogeneous(self, key: Key, spec: Obj, policy: Policy, state: _PolicyState, now: float) -> Round:
        assert policy.homogeneous is not None
        t = policy.homogeneous.target
        ns = t.namespace or key[0]
        ms = self._target(ns, t.name)
        if ms is None:
            msg = f"ModelServing {ns}/{t.name} not found"
            return Round(False, "TargetInvalid", msg, False, msg)
        current = current_replicas(ms)
        sources = ((spec.get("homogeneousTarget") or {}).get("target") or {}).get("metricSources")
        obs = await self.collector.observe(self._pods(), ns, t.name, None, policy.metrics, sources)
        obs = await self._woken(ns, ms, obs)
        rec, new_state = recommend_homogeneous(policy, state.homogeneous, obs, current, now, WAKE)
        reason, message = self._verdict(key, f"ModelServing {t.name}", current, rec.replicas, rec.reason, rec.skipped)
        wrote = False
        if not rec.skipped and rec.replicas != current and not self.dry_run:
            await self._scale(ns, t.name, rec.replicas)
            wrote = True
        state.homogeneous = new_state
        desired = rec.desired if rec.desired is not None else current
        return Round(True, reason, message, True, kind="homogeneous",
                     scaled=(Scaled("", current, desired, rec.mode, wrote),))

    async def _heterogeneous(self, key: Key, spec: Obj, policy: Policy, state: _PolicyState, now: float) -> Round:
        assert policy.heterogeneous is not None
        raw_params = (spec.get("heterogeneousTarget") or {}).get("params") or []
        current: dict[str, int] = {}
        where: dict[str, tuple[str, str]] = {}
        observations: dict[str, Observation] = {}
        for i, p in enumerate(policy.heterogeneous.params):
            mkey = p.target.key(key[0])
            ns = p.target.namespace or key[0]
            ms = self._target(ns, p.target.name)
            if ms is None:
                msg = f"ModelServing {ns}/{p.target.name} not found"
                return Round(False, "TargetInvalid", msg, False, msg)
            current[mkey] = current_replicas(ms)
            where[mkey] = (ns, p.target.name)
            sources = ((raw_params[i] if i < len(raw_params) else {}).get("target") or {}).get("metricSources")
            observations[mkey] = await self._woken(ns, ms, await self.collector.observe(
                self._pods(), ns, p.target.name, None, policy.metrics, sources))
        res, new_state = recommend_heterogeneous(policy, state.heterogeneous, observations, current, now, key[0],
                                                 WAKE)
        total = sum(current.values())
        reason, message = self._verdict(key, "the heterogeneous set", total, res.total.replicas, res.total.reason,
                                        res.total.skipped)
        scaled: list[Scaled] = []
        for p in policy.heterogeneous.params:
            mkey = p.target.key(key[0])
            want = res.replicas.get(mkey, current[mkey])
            wrote = False
            if not res.total.skipped and want != current[mkey] and not self.dry_run:
                await self._scale(*where[mkey], want)
                wrote = True
            scaled.append(Scaled(p.target.name, current[mkey], want, res.total.mode, wrote))
        state.heterogeneous = new_state
        if not res.total.skipped and any(s.desired != s.current for s in scaled):
            message += ": " + ", ".join(f"{s.name} {s.current} -> {s.desired}" for s in scaled)
        return Round(True, reason, message, True, kind="heterogeneous", scaled=tuple(scaled))

    async def _disaggregated(self, key: Key, spec: Obj, policy: Policy, state: _PolicyState, now: float) -> Round:
        d = policy.disaggregated
        assert d is not None
        ns = d.target.namespace or key[0]
        name = d.target.name
        ms = self._target(ns, name)
        if ms is None:
            msg = f"ModelServing {ns}/{name} not found"
            return Round(False, "TargetInvalid", msg, False, msg)
        try:
            current = role_replicas(ms, sorted(d.roles))
        except TargetError as exc:
            return Round(False, "TargetInvalid", str(exc), False, str(exc))
        raw_roles = (spec.get("disaggregatedTarget") or {}).get("roles") or {}
        observations: dict[str, Observation] = {}
        for role, param in sorted(d.roles.items()):
            if param.fixed:
                continue
            observations[role] = await self._woken(ns, ms, await self.collector.observe(
                self._pods(), ns, name, role, param.metrics, (raw_roles.get(role) or {}).get("metricSources")))
        res, new_states = recommend_disaggregated(policy, state.roles, observations, current, now,
                                                  {role: WAKE for role in d.roles})
        before = ", ".join(f"{r}={current[r]}" for r in sorted(current))
        after = ", ".join(f"{r.name}={r.replicas}" for r in res.roles)
        why = res.reason or "; ".join(f"{r.name}: {r.reason}" for r in res.roles if r.reason)
        changed = not res.skipped and any(r.replicas != r.current for r in res.roles)
        if res.skipped:
            reason, message = "Reconciled", f"no scaling this round: {res.reason}"
        elif not changed:
            reason, message = "Reconciled", f"roles kept at {before} ({why})"
        elif self.dry_run:
            log.info("%s/%s: dry run: would scale roles %s -> %s (%s)", key[0], key[1], before, after, why)
            reason, message = "DryRun", f"dry run: would scale roles {before} -> {after} ({why})"
        else:
            log.info("%s/%s: scaling roles %s -> %s (%s)", key[0], key[1], before, after, why)
            reason, message = "Reconciled", f"scaled roles {before} -> {after} ({why})"
        if changed and not self.dry_run:
            patch = roles_patch(ms, res.replicas())
            if patch is not None:
                try:
                    await self.writer.merge_patch(object_path(MODEL_SERVING.api_version, MODEL_SERVING.plural, ns,
                                                              name), patch)
                except Conflict as exc:  # changed since cached: the next round re-reads it
                    raise _WriteFailed(f"role replicas of ModelServing {ns}/{name}: {exc}", RETRY_CONFLICT_S) from None
                except ApiError as exc:
                    raise _WriteFailed(f"role replicas of ModelServing {ns}/{name}: {exc}", None) from None
        state.roles = new_states
        wrote = changed and not self.dry_run
        scaled = tuple(Scaled(r.name, r.current, r.desired if not res.skipped else r.current, r.mode,
                              wrote and r.replicas != r.current) for r in res.roles)
        ratio = None
        if d.ratio is not None:
            ratio = (d.ratio.numerator_role, d.ratio.denominator_role, res.current_ratio)
        return Round(True, reason, message, True, kind="disaggregated", scaled=scaled, ratio=ratio,
                     ratio_adjusted=res.ratio_adjusted and not res.skipped,
                     ratio_violated=(not res.ratio_met) if d.ratio is not None else None)

    # --- status ---------------------------------------------------------------------------------
    async def _write_status(self, key: Key, obj: Obj, rnd: Round) -> None:
        if len(rnd.message) > _MAX_MESSAGE:
            rnd = Round(**{**rnd.__dict__, "message": rnd.message[:_MAX_MESSAGE - 3] + "..."})
        new = desired_status(obj, rnd, self.clock())
        patch = mergepatch.diff(obj.get("status") or {}, new)
        if not patch:
            return
        rv = str(obj["metadata"].get("resourceVersion") or "")
        path = object_path(AUTOSCALING_POLICY.api_version, AUTOSCALING_POLICY.plural, key[0], key[1])
        try:
            written = await self.writer.patch_status(path, rv, patch)
        except Conflict as exc:  # changed meanwhile: the next round writes it again
            log.info("%s/%s: status not written: %s", key[0], key[1], exc)
            return
        except ApiError as exc:
            log.warning("%s/%s: status not written: %s", key[0], key[1], exc)
            return
        if written.get("metadata"):
            self._written[key] = (rv, written)
