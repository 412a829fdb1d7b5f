"""One scaling round for one scalable unit (a ModelServing, the sum of a heterogeneous set,
or one role): (behaviour, metric targets, bounds, state, observation, current, now) ->
(recommendation, new state). Pure: the clock is an argument, the state a value.

Order, as Kthena's scaleOneTarget:
1. the metric recommendation (metrics.raw_recommendation; none -> the round is skipped);
2. panic: a recommendation >= panicThresholdPercent % of the current count starts (or
   extends) panic mode for panicModeHold; a hold of 0 disables panic mode;
3. the correction:
   - panic: scale-up limited to percent % per panic period above the lowest count of that
     period (no limit with period 0), and never below the current count (no scale-down);
   - stable scale-down: not below the highest recommendation of the scale-down
     stabilizationWindow, and not below max-of-period minus (instances | percent %): with
     selectPolicy Or the larger step is allowed, with And the smaller; never above current;
   - stable scale-up: not above the lowest recommendation of the scale-up
     stabilizationWindow, and not above min-of-period plus (instances | percent %), Or the
     larger step, And the smaller; never below current;
   then clamped to [minReplicas, maxReplicas];
4. the round is recorded (recommendation, corrected count, time) for later windows.

Ours beyond Kthena: an optional wake signal (scale to and from zero; see Wake).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .metrics import Observation, raw_recommendation
from .policy import AND, Behavior, Policy, StablePolicy
from .windows import MAX, MIN, History, Sample, line_chart_best, record_window_best

__all__ = ["PANIC", "STABLE", "Recommendation", "ScalerState", "Wake", "horizon", "recommend_homogeneous", "scale_one"]

STABLE = "Stable"
PANIC = "Panic"


@dataclass(frozen=True)
class ScalerState:
    """What one unit's autoscaler remembers between rounds (Kthena's Status)."""
    history: History = History()
    panic_until: float | None = None  # panic mode holds while now <= panic_until

    def in_panic(self, now: float) -> bool:
        return self.panic_until is not None and now <= self.panic_until


@dataclass(frozen=True)
class Wake:
    """Scale to zero and back (beyond Kthena; configured outside the CRD). `metric` names a
    signal such as pending requests at the router, read from the observation like any
    metric. > 0: at least one replica, even from zero where no pod can report anything.
    == 0: the metric recommendation may reach minReplicas 0. Missing: never down to zero."""
    metric: str


@dataclass(frozen=True)
class Recommendation:
    replicas: int  # the count to ask for (the current count when skipped)
    desired: int | None  # the metric recommendation before the behaviour rules
    mode: str  # Stable | Panic
    reason: str
    skipped: bool = False  # no metric data: write nothing, record nothing (Kthena's -1)


def horizon(behavior: Behavior) -> float:
    """The longest look-back any rule needs (the history keeps twice this)."""
    return max(behavior.scale_up.period, behavior.scale_up.stabilization_window, behavior.scale_down.period,
               behavior.scale_down.stabilization_window, behavior.panic.period, 1.0)


def _step(policy: StablePolicy, past: int, up: bool) -> int:
    """The count reachable from `past` within one period (Go int32 arithmetic, truncating)."""
    sign = 1 if up else -1
    absolute = past + sign * policy.instances
    relative = past + sign * (past * policy.percent // 100)
    permissive = max if up else min
    strict = min if up else max
    return strict(absolute, relative) if policy.select_policy == AND else permissive(absolute, relative)


def _stable_down(b: Behavior, h: History, rec: int, current: int, now: float) -> tuple[int, str]:
    corrected, notes = rec, []
    best = record_window_best(h, now, b.scale_down.stabilization_window, MAX)
    if best is not None and best > corrected:
        corrected = best
        notes.append(f"stabilization window {b.scale_down.stabilization_window:g}s keeps {best}")
    past = line_chart_best(h, now, b.scale_down.period, current, MAX)
    if past is not None:
        floor = _step(b.scale_down, past, up=False)
        if floor > corrected:
            corrected = floor
            notes.append(f"scaleDown allows {floor} per {b.scale_down.period:g}s from {past}")
    return min(corrected, current), "; ".join(notes)


def _stable_up(b: Behavior, h: History, rec: int, current: int, now: float) -> tuple[int, str]:
    corrected, notes = rec, []
    pol = b.scale_up
    best = record_window_best(h, now, pol.stabilization_window, MIN)
    if best is not None and best < corrected:
        corrected = best
        notes.append(f"stabilization window {pol.stabilization_window:g}s keeps {best}")
    past = line_chart_best(h, now, pol.period, current, MIN)
    if past is not None:
        ceiling = _step(pol, past, up=True)
        if ceiling < corrected:
            corrected = ceiling
            notes.append(f"stablePolicy allows {ceiling} per {pol.period:g}s from {past}")
    return max(corrected, current), "; ".join(notes)


def _panic(b: Behavior, h: History, rec: int, current: int, now: float) -> tuple[int, str]:
    corrected, note = rec, ""
    past = line_chart_best(h, now, b.panic.period, current, MIN)
    if past is not None and past > 0:
        ceiling = past + int(past * b.panic.percent / 100.0)
        if ceiling < corrected:
            corrected, note = ceiling, f"panicPolicy allows {ceiling} per {b.panic.period:g}s from {past}"
    return max(corrected, current), note


def _wake_floor(wake: Wake | None, observation: Observation, current: int) -> tuple[int, str]:
    if wake is None:
        return 0, ""
    sample = observation.metrics.get(wake.metric)
    if sample is None or not sample.present:
        return min(current, 1), f"wake signal {wake.metric} missing"
    if sample.total() > 0:
        return 1, f"wake signal {wake.metric} = {sample.total():g}"
    return 0, ""


def scale_one(behavior: Behavior, targets: Mapping[str, float], tolerance: float, lo: int, hi: int,
              state: ScalerState, observation: Observation, current: int, now: float,
              wake: Wake | None = None) -> tuple[Recommendation, ScalerState]:
    raw = raw_recommendation(targets, observation, current, lo, hi, tolerance)
    floor, wake_note = _wake_floor(wake, observation, current)
    floor = min(floor, hi)
    rec, reason = raw.replicas, raw.reason
    if rec is None:
        if not (current == 0 and floor > 0):
            mode = PANIC if state.in_panic(now) else STABLE
            return Recommendation(current, None, mode, raw.reason, skipped=True), state
        rec, reason = max(floor, lo), wake_note  # from zero nothing reports but the wake signal
    elif rec < floor:
        rec, reason = floor, f"{reason}; {wake_note}"

    threshold = behavior.panic.threshold_percent
    panicking = state.in_panic(now)
    refresh = threshold is not None and rec > current and rec * 100 >= current * threshold
    if refresh:
        panicking = behavior.panic.hold > 0
    if panicking:
        corrected, note = _panic(behavior, state.history, rec, current, now)
    elif rec < current:
        corrected, note = _stable_down(behavior, state.history, rec, current, now)
    elif rec > current:
        corrected, note = _stable_up(behavior, state.history, rec, current, now)
    else:
        corrected, note = rec, ""
    corrected = max(min(max(corrected, lo), hi), floor)

    panic_until = state.panic_until
    if refresh:
        panic_until = now + behavior.panic.hold if behavior.panic.hold > 0 else None
    new_state = ScalerState(state.history.record(Sample(now, rec, corrected), horizon(behavior)), panic_until)
    mode = PANIC if panicking else STABLE
    if note:
        reason = f"{reason}; {note}"
    return Recommendation(corrected, rec, mode, reason), new_state


def recommend_homogeneous(policy: Policy, state: ScalerState, observation: Observation, current: int, now: float,
                          wake: Wake | None = None) -> tuple[Recommendation, ScalerState]:
    """One round for a homogeneousTarget: the whole ModelServing's replicas."""
    target = policy.homogeneous
    if target is None:
        raise ValueError("policy has no homogeneousTarget")
    return scale_one(policy.behavior, policy.metrics, policy.tolerance, target.min_replicas, target.max_replicas,
                     state, observation, current, now, wake)
