"""Recovery of failed, restarted and lost pods: Kthena's `spec.recoveryPolicy`
(ServingGroupRecreate | RoleRecreate, the default | None) and
`spec.template.restartGracePeriodSeconds`.

What triggers a recovery (Kthena's predicates, pkg/model-serving-controller):
- an *errored* pod: phase Failed, or phase Running/Pending with any container or init
  container restartCount > 0;
- a *lost* pod: one this process saw owned and that vanished (deleted, evicted, garbage
  collected) without the controller deleting it.

An errored pod is acted on once its grace period is over: with restartGracePeriodSeconds
0 (the default) at once; otherwise when `trouble_since(pod) + grace` has passed, and then
only if it has not recovered (a restarted pod that is Running and Ready again is kept, as
Kthena checks readiness after the grace period). A lost pod is acted on at once.

Acting recreates the *unit* the policy names: RoleRecreate deletes every pod (and the
headless Service) of that role replica, ServingGroupRecreate every pod and Service of the
ServingGroup; the planner then creates what is missing, from the current template. With
None, as Kthena's code does, only the errored pod itself is deleted (and recreated by the
planner): nothing else of its role or group is touched, and a lost pod is just recreated.

Exactly once, level-triggered: an errored pod is judged from its observed status only
(phase, restartCount, the container termination and Ready transition times), so a second
reconcile, or a new process after a crash, reaches the same verdict about the same pod uid;
once deleted, the uid is hidden by the expectations overlay until the cache shows it gone,
and a pod with a deletionTimestamp is never owned-and-live again. Deletes go siblings first,
the errored pods last: a crash half-way leaves the errored pod in place, so the next run
finishes the same unit. Lost pods are the one in-memory signal (as in Kthena, whose
pod-deleted handler is event-driven): a process that restarts has no previous observation
and only recreates the missing pods.

No storm: per unit, recoveries back off like the kubelet's CrashLoopBackOff (the first at
once; the next not before 10 s after the previous, doubling to 300 s; reset after 600 s
without one). A pod flapping within its grace period is never deleted (each Ready
transition restarts the window). Waiting is a requeue-after, never a sleep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from . import naming as n

__all__ = ["Backoff", "Decision", "Recovery", "Unit", "decide", "grace_seconds", "is_errored", "policy",
           "trouble_since"]

Obj = dict[str, Any]
Key = tuple[str, str]

SERVING_GROUP_RECREATE = "ServingGroupRecreate"
ROLE_RECREATE = "RoleRecreate"
NONE = "None"

BACKOFF_BASE = 10.0  # seconds; as the kubelet's CrashLoopBackOff
BACKOFF_CAP = 300.0
BACKOFF_RESET = 600.0


def policy(ms: Obj) -> str:
    return str((ms.get("spec") or {}).get("recoveryPolicy") or ROLE_RECREATE)


def grace_seconds(ms: Obj) -> float:
    raw = ((ms.get("spec") or {}).get("template") or {}).get("restartGracePeriodSeconds")
    try:
        return max(0.0, float(raw)) if raw is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _status(pod: Obj) -> Obj:
    return pod.get("status") or {}


def _container_statuses(pod: Obj) -> list[Obj]:
    st = _status(pod)
    return list(st.get("initContainerStatuses") or []) + list(st.get("containerStatuses") or [])


def is_failed(pod: Obj) -> bool:
    return _status(pod).get("phase") == "Failed"


def restarted(pod: Obj) -> bool:
    """Kthena's ContainerRestarted: Running or Pending with a container restarted at least once."""
    if _status(pod).get("phase") not in ("Running", "Pending"):
        return False
    return any(int(cs.get("restartCount") or 0) > 0 for cs in _container_statuses(pod))


def is_errored(pod: Obj) -> bool:
    return is_failed(pod) or restarted(pod)


def _ready_condition(pod: Obj) -> Obj | None:
    for c in _status(pod).get("conditions") or []:
        if c.get("type") == "Ready":
            return c
    return None


def running_and_ready(pod: Obj) -> bool:
    c = _ready_condition(pod)
    return _status(pod).get("phase") == "Running" and c is not None and c.get("status") == "True"


def _parse_time(raw: Any) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def trouble_since(pod: Obj) -> datetime | None:
    """When the pod's current trouble began, from its status: the latest container
    termination (a restart or the final failure) and, while it is not Ready, the time it
    became not Ready. None when the status carries no such time."""
    times: list[datetime] = []
    for cs in _container_statuses(pod):
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            t = _parse_time((state.get("terminated") or {}).get("finishedAt"))
            if t is not None:
                times.append(t)
    c = _ready_condition(pod)
    if c is not None and c.get("status") != "True":
        t = _parse_time(c.get("lastTransitionTime"))
        if t is not None:
            times.append(t)
    return max(times) if times else None


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


@dataclass(frozen=True, order=True)
class Unit:
    """What one recovery recreates: a role replica, (role empty) a whole ServingGroup, or
    (pod set, policy None) one pod."""
    group: str
    role: str = ""
    role_id: str = ""
    pod: str = ""

    def holds(self, obj: Obj) -> bool:
        """Pods of the unit (a one-pod unit holds no Service, named like the entry pod though)."""
        lb = _labels(obj)
        if lb.get(n.LABEL_GROUP) != self.group:
            return False
        if self.pod:
            return str((obj.get("metadata") or {}).get("name")) == self.pod and n.LABEL_REVISION in lb
        return not self.role or (lb.get(n.LABEL_ROLE) == self.role and lb.get(n.LABEL_ROLE_ID) == self.role_id)

    def __str__(self) -> str:
        return self.pod or (f"{self.group}/{self.role_id}" if self.role else self.group)


def unit_of(pod: Obj, recovery_policy: str) -> Unit | None:
    lb = _labels(pod)
    group = lb.get(n.LABEL_GROUP)
    if not group:
        return None
    if recovery_policy == NONE:
        return Unit(group, lb.get(n.LABEL_ROLE, ""), lb.get(n.LABEL_ROLE_ID, ""),
                    str((pod.get("metadata") or {}).get("name")))
    if recovery_policy == SERVING_GROUP_RECREATE:
        return Unit(group)
    return Unit(group, lb.get(n.LABEL_ROLE, ""), lb.get(n.LABEL_ROLE_ID, ""))


@dataclass(frozen=True)
class Backoff:
    """The recoveries of one unit in a row: how many, the last one, the pods that caused it."""
    count: int
    last: datetime
    triggers: frozenset[str]


@dataclass
class Decision:
    delete_pods: list[Obj] = field(default_factory=list)  # siblings first, the errored pods last
    delete_services: list[Obj] = field(default_factory=list)
    recreate: list[tuple[Unit, str]] = field(default_factory=list)  # (unit, why)
    triggers: dict[Unit, frozenset[str]] = field(default_factory=dict)  # uids that caused each recreate
    postponed: list[tuple[Unit, float]] = field(default_factory=list)  # (unit, seconds to wait): backoff
    requeue_after: float | None = None  # look again then (a grace period or a backoff ends)

    def _wait(self, seconds: float) -> None:
        seconds = max(0.05, seconds + 0.01)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def backoff_delay(count: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """The wait after `count` recoveries in a row (count >= 1)."""
    return min(cap, base * 2 ** max(0, count - 1))


def _backoff_wait(h: Backoff | None, triggers: frozenset[str], now: datetime, base: float, cap: float,
                  reset: float) -> float:
    """Seconds until the unit may be recreated again (0: now). A retry for the same trigger
    (a reconcile that failed half-way) is never held back."""
    if h is None or triggers & h.triggers:
        return 0.0
    since = (now - h.last).total_seconds()
    if since >= reset:
        return 0.0
    return max(0.0, backoff_delay(h.count, base, cap) - since)


def decide(ms: Obj, pods: list[Obj], services: list[Obj], now: datetime, *, lost: Iterable[Obj] = (),
           first_seen: Mapping[str, datetime] | None = None, history: Mapping[Unit, Backoff] | None = None,
           base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP, reset: float = BACKOFF_RESET) -> Decision:
    """Pure. `pods`/`services`: the live objects the ModelServing owns (with the controller's
    own unseen writes applied); `lost`: owned pods that vanished without the controller
    deleting them; `first_seen`: uid -> when an errored pod whose status has no time was
    first seen; `history`: backoff per unit."""
    first_seen = first_seen or {}
    history = history or {}
    pol = policy(ms)
    grace = grace_seconds(ms)
    d = Decision()
    why: dict[Unit, list[str]] = {}
    triggers: dict[Unit, set[str]] = {}
    errored_uids: set[str] = set()

    def want(unit: Unit, uid: str, reason: str) -> None:
        why.setdefault(unit, []).append(reason)
        triggers.setdefault(unit, set()).add(uid)

    for pod in pods:
        if not is_errored(pod):
            continue
        unit = unit_of(pod, pol)
        if unit is None:
            continue
        name = str(pod["metadata"].get("name"))
        what = "failed" if is_failed(pod) else "restarted"
        if grace > 0:
            since = trouble_since(pod) or first_seen.get(_uid(pod)) or now
            left = (since + timedelta(seconds=grace) - now).total_seconds()
            if not is_failed(pod) and running_and_ready(pod):
                continue  # recovered (within or after the grace period)
            if left > 0:
                d._wait(left)
                continue
            what += f", not recovered within {grace:g}s"
        errored_uids.add(_uid(pod))
        want(unit, _uid(pod), f"pod {name} {what}")
    for pod in lost if pol != NONE else ():  # None: the planner recreates a lost pod alone
        unit = unit_of(pod, pol)
        if unit is not None:
            want(unit, _uid(pod), f"pod {pod['metadata'].get('name')} was deleted")

    for unit in sorted(why):
        t = frozenset(triggers[unit])
        wait = _backoff_wait(history.get(unit), t, now, base, cap, reset)
        if wait > 0:
            d.postponed.append((unit, wait))
            d._wait(wait)
            continue
        doomed = [p for p in pods if unit.holds(p)]
        if not doomed:
            continue  # nothing of it is left: the planner creates it whole
        d.recreate.append((unit, "; ".join(why[unit])))
        d.triggers[unit] = t
        d.delete_pods += doomed
        d.delete_services += [s for s in services if unit.holds(s)]
    d.delete_pods.sort(key=lambda p: (_uid(p) in errored_uids, str(p["metadata"].get("name"))))
    return d


def record(history: Mapping[Unit, Backoff], d: Decision, now: datetime, reset: float = BACKOFF_RESET
           ) -> dict[Unit, Backoff]:
    """The backoff history after the recreations of `d` (pure)."""
    out = dict(history)
    for unit, t in d.triggers.items():
        h = out.get(unit)
        if h is not None and t & h.triggers:
            out[unit] = replace(h, triggers=h.triggers | t)  # the same recovery, retried
        elif h is None or (now - h.last).total_seconds() >= reset:
            out[unit] = Backoff(1, now, t)
        else:
            out[unit] = Backoff(h.count + 1, now, t)
    return out


@dataclass
class _State:
    ms_uid: str
    seen: dict[str, Obj] = field(default_factory=dict)  # uid -> pod, at the previous reconcile
    lost: dict[str, Obj] = field(default_factory=dict)  # uid -> pod, waiting for its unit's recreation
    first_seen: dict[str, datetime] = field(default_factory=dict)
    history: dict[Unit, Backoff] = field(default_factory=dict)


class Recovery:
    """The per-ModelServing memory around `decide`: the pods seen at the previous reconcile
    (to notice lost ones), when timeless errored pods were first seen, and the backoff."""

    def __init__(self, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP, reset: float = BACKOFF_RESET) -> None:
        self.base, self.cap, self.reset = base, cap, reset
        self._state: dict[Key, _State] = {}

    def forget(self, key: Key) -> None:
        self._state.pop(key, None)

    def applied(self, key: Key, d: Decision) -> None:
        """The deletes of `d` went through: its lost pods are dealt with."""
        st = self._state.get(key)
        if st is not None:
            done = set().union(*d.triggers.values()) if d.triggers else set()
            st.lost = {u: p for u, p in st.lost.items() if u not in done}

    def step(self, key: Key, ms: Obj, pods: list[Obj], services: list[Obj], ours: set[str],
             now: datetime) -> Decision:
        """`pods`: live owned pods with the controller's unseen writes applied; `ours`: uids
        of pods the controller deleted whose removal the cache may not show yet (they are
        not lost)."""
        ms_uid = _uid(ms)
        st = self._state.get(key)
        if st is None or st.ms_uid != ms_uid:
            st = self._state[key] = _State(ms_uid)
        live = {_uid(p): p for p in pods}
        for uid, pod in st.seen.items():
            if uid not in live and uid not in ours:
                st.lost[uid] = pod
        st.seen = live
        st.first_seen = {u: st.first_seen.get(u, now) for u, p in live.items()
                         if is_errored(p) and trouble_since(p) is None}
        d = decide(ms, pods, services, now, lost=list(st.lost.values()), first_seen=st.first_seen,
                   history=st.history, base=self.base, cap=self.cap, reset=self.reset)
        st.history = record(st.history, d, now, self.reset)
        pending = {u for u, _ in d.postponed} | set(d.triggers)
        pol = policy(ms)
        # a lost pod stays remembered while its unit's recreation is postponed or not yet
        # done (applied() drops it once the deletes went through)
        st.lost = {u: p for u, p in st.lost.items() if unit_of(p, pol) in pending}
        cutoff = now - timedelta(seconds=self.reset)
        st.history = {u: h for u, h in st.history.items() if h.last > cutoff}
        return d
