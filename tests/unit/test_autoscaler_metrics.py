"""The metric recommendation (Kthena's RecommendedInstancesAlgorithm / HPA rules) and the
window queries (Kthena's sliding windows)."""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.autoscaler.metrics import MetricSample, Observation, desired_for_external, desired_for_pods, \
    raw_recommendation
from controller.autoscaler.windows import MAX, MIN, History, Sample, line_chart_best, record_window_best


def test_external_metric_tolerance_and_ceiling() -> None:
    assert desired_for_external(4, 0.1, 10, 42) == 4  # 4.2 / 4 = 1.05: within 10 %
    assert desired_for_external(4, 0.1, 10, 45) == 5  # 1.125: ceil(4.5)
    assert desired_for_external(4, 0.1, 10, 31) == 4  # 0.775 -> ceil(3.1) = 4
    assert desired_for_external(4, 0.1, 10, 29) == 3
    assert desired_for_external(0, 0.1, 10, 1) == 1  # from zero any demand counts
    assert desired_for_external(0, 0.1, 10, 0) == 0


def test_pod_metric_without_unready_or_silent_pods() -> None:
    assert desired_for_pods(3, 0.1, 10, MetricSample(pods=(10, 10, 11)), 0) == 3  # ratio 1.03
    assert desired_for_pods(3, 0.1, 10, MetricSample(pods=(20, 20, 20)), 0) == 6
    assert desired_for_pods(3, 0.1, 10, MetricSample(pods=(2, 2, 2)), 0) == 1
    assert desired_for_pods(3, 0.1, 10, MetricSample(), 0) is None
    # the tolerance is relative to the current count (Kthena's summed pods would keep 4 here)
    assert desired_for_pods(4, 0.1, 10, MetricSample(pods=(2.5, 2.5, 2.5, 3.0)), 0) == 2


def test_pod_metric_unready_pods_damp_a_scale_up() -> None:
    # 2 ready at 20 (ratio 2), 2 unready counted as 0: 40 / 4 / 10 = 1.0 -> within tolerance
    assert desired_for_pods(4, 0.1, 10, MetricSample(pods=(20, 20)), 2) == 4
    # 2 ready at 30, 1 unready: 60 / 3 = 20 per pod -> ceil(2.0 * 3) = 6
    assert desired_for_pods(3, 0.1, 10, MetricSample(pods=(30, 30)), 1) == 6
    # unready pods do not matter on a scale-down: 2 ready at 2 -> ceil(0.2 * 2) = 1
    assert desired_for_pods(4, 0.1, 10, MetricSample(pods=(2, 2)), 2) == 1


def test_pod_metric_silent_pods_count_as_on_target_when_scaling_down() -> None:
    # 2 report 0, 2 silent (assumed 10): 20 / 4 / 10 = 0.5 -> 2 (not 0)
    assert desired_for_pods(4, 0.1, 10, MetricSample(pods=(0, 0), missing_pods=2), 0) == 2
    # silent pods count as 0 on a scale-up: 2 at 30, 2 silent: 60 / 4 = 1.5 -> 6
    assert desired_for_pods(4, 0.1, 10, MetricSample(pods=(30, 30), missing_pods=2), 0) == 6
    # the direction flips once the silent pods are counted -> keep the current count
    assert desired_for_pods(4, 0.1, 10, MetricSample(pods=(11,), missing_pods=3), 0) == 4


def test_raw_recommendation_takes_the_largest_and_clamps() -> None:
    obs = Observation({"a": MetricSample(external=30), "b": MetricSample(external=300)})
    raw = raw_recommendation({"a": 10, "b": 10}, obs, 3, 1, 20, 0.1)
    assert raw.replicas == 20 and raw.by_metric == {"a": 3, "b": 30} and raw.missing == ()
    assert raw_recommendation({"a": 10}, Observation({"a": MetricSample(external=0)}), 3, 2, 20, 0.1).replicas == 2


def test_raw_recommendation_with_missing_metrics() -> None:
    none = raw_recommendation({"a": 10, "b": 10}, Observation(), 3, 1, 20, 0.1)
    assert none.replicas is None and none.missing == ("a", "b")
    part = raw_recommendation({"a": 10, "b": 10}, Observation({"a": MetricSample(external=5)}), 3, 1, 20, 0.1)
    assert part.replicas == 3 and part.missing == ("b",)
    up = raw_recommendation({"a": 10, "b": 10}, Observation({"a": MetricSample(external=70)}), 3, 1, 20, 0.1)
    assert up.replicas == 7


def _h(*points: tuple[float, int, int]) -> History:
    return History(tuple(Sample(t, r, c) for t, r, c in points))


def test_record_window_is_inclusive_and_disabled_at_zero() -> None:
    h = _h((0, 9, 9), (10, 4, 4), (20, 6, 6))
    assert record_window_best(h, 60, 60, MAX) == 9  # 0 + 60 >= 60
    assert record_window_best(h, 61, 60, MAX) == 6
    assert record_window_best(h, 61, 60, MIN) == 4
    assert record_window_best(h, 20, 0, MAX) is None
    assert record_window_best(History(), 20, 60, MAX) is None


def test_line_chart_counts_a_value_until_it_was_replaced() -> None:
    h = _h((0, 0, 2), (100, 0, 8))  # 2 held from 0 to 100, then 8
    assert line_chart_best(h, 160, 60, 8, MIN) == 2  # replaced 60 s ago: still in the window
    assert line_chart_best(h, 161, 60, 8, MIN) == 8
    assert line_chart_best(h, 161, 60, 5, MIN) == 5  # the current count always counts
    assert line_chart_best(h, 161, 0, 5, MIN) is None


def test_line_chart_drops_a_value_held_longer_than_twice_the_period() -> None:
    # Kthena resets its drifting value after 2 x period: 2 (chosen at 0) is not pushed when
    # the next round comes at 100 > 2 x 30, so it never enters the window.
    h = _h((0, 0, 2), (100, 0, 8))
    assert line_chart_best(h, 110, 30, 8, MIN) == 8
    h2 = _h((0, 0, 2), (50, 0, 8))
    assert line_chart_best(h2, 60, 30, 8, MIN) == 2
    # the latest value counts while it is at most 2 x period old
    assert line_chart_best(_h((0, 0, 9)), 60, 30, 5, MAX) == 9
    assert line_chart_best(_h((0, 0, 9)), 61, 30, 5, MAX) == 5


def test_history_forgets_what_no_window_can_see() -> None:
    h = History()
    for t in range(0, 1000, 15):
        h = h.record(Sample(float(t), 1, 1), horizon=60)
    assert len(h.samples) <= 10
    assert h.samples[0].time < 990 - 120 <= h.samples[1].time


class _DequeModel:
    """A stateful model of Kthena's monotonic-deque windows (sliding_window.go), used as the
    oracle for our stateless queries: query at `now`, then append at the same `now`."""

    def __init__(self, fresh: float, better: Any) -> None:
        self.fresh, self.better = fresh, better
        self.pool: deque[tuple[float, int]] = deque()
        self.drift: tuple[float, int] | None = None

    def _expire(self, now: float, line: bool) -> None:
        while self.pool and self.pool[0][0] + self.fresh < now:
            self.pool.popleft()
        if line and self.drift is not None and self.drift[0] + 2 * self.fresh < now:
            self.drift = None

    def _push(self, now: float, value: int) -> None:
        while self.pool and not self.better(self.pool[-1][1], value):
            self.pool.pop()
        self.pool.append((now, value))

    def record_append(self, now: float, value: int) -> None:
        self._expire(now, False)
        self._push(now, value)

    def record_best(self, now: float) -> int | None:
        self._expire(now, False)
        return self.pool[0][1] if self.pool and self.fresh > 0 else None

    def line_append(self, now: float, value: int) -> None:
        self._expire(now, True)
        if self.drift is not None:
            self._push(now, self.drift[1])
        self.drift = (now, value)

    def line_best(self, now: float, current: int) -> int | None:
        if self.fresh == 0:
            return None
        self._expire(now, True)
        value = current
        if self.drift is not None and self.better(self.drift[1], value):
            value = self.drift[1]
        if self.pool and self.better(self.pool[0][1], value):
            value = self.pool[0][1]
        return value


@settings(max_examples=300, deadline=None)
@given(fresh=st.sampled_from([0.0, 15.0, 30.0, 60.0]), maximum=st.booleans(),
       rounds=st.lists(st.tuples(st.sampled_from([1.0, 15.0, 30.0, 45.0, 90.0, 200.0]), st.integers(0, 9),
                                 st.integers(0, 9)), min_size=1, max_size=30))
def test_windows_answer_as_kthenas_deques(fresh: float, maximum: bool, rounds: list[tuple[float, int, int]]) -> None:
    better = MAX if maximum else MIN
    rec_model, line_model = _DequeModel(fresh, better), _DequeModel(fresh, better)
    history, now = History(), 0.0
    for gap, value, current in rounds:
        now += gap
        assert record_window_best(history, now, fresh, better) == rec_model.record_best(now)
        assert line_chart_best(history, now, fresh, current, better) == line_model.line_best(now, current)
        rec_model.record_append(now, value)
        line_model.line_append(now, value)
        history = history.record(Sample(now, value, value), horizon=max(fresh, 1.0))
