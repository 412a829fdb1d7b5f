"""The autoscaler replayed over metric traces, one round per 15 s (Kthena's sync period),
each recommendation applied before the next round: a burst (panic), a slow ramp, a flapping
signal, a drop to zero (and scale from zero with a wake signal), missing metrics."""

from __future__ import annotations

from controller.autoscaler import MetricSample, Observation, ScalerState, Wake, recommend_homogeneous
from tests.unit.autoscaler_fixtures import behavior, ext, homogeneous, modes, replay, replicas


def test_burst_enters_panic_doubles_per_panic_period_and_never_scales_down_while_panicking() -> None:
    policy = homogeneous(1, 20, beh=behavior(
        up={"instances": 1, "percent": 10, "period": "60s"},
        panic={"percent": 100, "period": "30s", "panicThresholdPercent": 200, "panicModeHold": "60s"},
        down={"stabilizationWindow": "120s"}))
    loads = [20, 20, 100] + [200] * 6 + [20] * 9
    steps = replay(policy, [ext(load=v) for v in loads], start=2)
    # t2: 10 wanted >= 200 % of 2 -> panic; +100 % over the lowest count of the last 30 s.
    assert replicas(steps) == [2, 2, 4, 4, 4, 8, 8, 8, 16] + [16] * 8 + [2]
    # panic from t2, refreshed up to t8, held 60 s (to t12); then the 120 s window keeps the
    # t8 recommendation (20, capped by current 16) until it ages out at t17.
    assert modes(steps) == ["S", "S"] + ["P"] * 11 + ["S"] * 5
    assert [s.rec.desired for s in steps][8:10] == [20, 2]
    assert "panicPolicy allows 4" in steps[2].rec.reason


def test_same_burst_without_panic_follows_the_stable_rate_limit() -> None:
    policy = homogeneous(1, 20, beh=behavior(
        up={"instances": 1, "percent": 10, "period": "60s"}, panic={"panicModeHold": "0s"}))
    loads = [20, 20, 100] + [200] * 10
    steps = replay(policy, [ext(load=v) for v in loads], start=2)
    # +max(1, 10 %) over the lowest count still in force within the last 60 s.
    assert replicas(steps) == [2, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 5]
    assert set(modes(steps)) == {"S"}
    assert "stablePolicy allows 3 per 60s from 2" in steps[2].rec.reason


def test_slow_ramp_is_followed_within_tolerance_and_stays_stable() -> None:
    policy = homogeneous(1, 10, beh=behavior(
        up={"instances": 2, "percent": 0, "period": "60s"}, panic={"panicModeHold": "60s"}))
    loads = [41, 45, 49, 53, 57, 61, 65, 69, 73, 76, 80]
    steps = replay(policy, [ext(load=v) for v in loads], start=4)
    # 4.1 on 4 and 4.9 on 5 are within the 10 % tolerance; 4.5 on 4 is not.
    assert replicas(steps) == [4, 5, 5, 5, 6, 6, 6, 7, 7, 7, 8]
    assert set(modes(steps)) == {"S"}


def test_flapping_signal_is_damped_by_the_scale_down_stabilization_window() -> None:
    loads = [80, 20] * 3 + [20] * 6
    damped = replay(homogeneous(1, 10, beh=behavior(down={"stabilizationWindow": "60s"})),
                    [ext(load=v) for v in loads], start=8)
    # the last 8 was recommended at t4; it keeps the count until t4 + 60 s = t8.
    assert replicas(damped) == [8] * 9 + [2] * 3
    assert "stabilization window 60s keeps 8" in damped[1].rec.reason
    undamped = replay(homogeneous(1, 10, beh=behavior()), [ext(load=v) for v in loads], start=8)
    assert replicas(undamped) == [8, 2, 8, 2, 8, 2] + [2] * 6


def test_drop_to_zero_scales_down_at_the_scale_down_rate_to_min_replicas() -> None:
    policy = homogeneous(1, 10, beh=behavior(down={"instances": 1, "percent": 0, "period": "30s"}))
    steps = replay(policy, [ext(load=50)] + [ext(load=0)] * 11, start=5)
    # -1 below the highest count in force within the last 30 s (a count replaced exactly
    # 30 s ago still counts, as Kthena's inclusive freshness): a step every third round.
    assert replicas(steps) == [5, 4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1]
    assert [s.rec.desired for s in steps][1:3] == [1, 1]


def test_scale_to_zero_and_back_with_a_wake_signal() -> None:
    policy = homogeneous(0, 5, beh=behavior())
    wake = Wake("pending")

    def obs(pods: tuple[float, ...], pending: float | None) -> Observation:
        metrics = {"load": MetricSample(pods=pods)} if pods else {}
        if pending is not None:
            metrics["pending"] = MetricSample(external=pending)
        return Observation(metrics)

    trace = [obs((10, 10), 1), obs((0, 0), 0), obs((), 0), obs((), 4), obs((30,), 4), obs((10, 10, 10), 0)]
    steps = replay(policy, trace, start=2, wake=wake)
    assert replicas(steps) == [2, 0, 0, 1, 3, 3]
    assert [s.rec.skipped for s in steps] == [False, False, True, False, False, False]
    assert "wake signal pending = 4" in steps[3].rec.reason
    # Kthena (no wake signal): at zero replicas no pod reports, every round is skipped.
    stuck = replay(policy, trace[:4], start=2)
    assert replicas(stuck) == [2, 0, 0, 0]
    assert [s.rec.skipped for s in stuck] == [False, False, True, True]


def test_a_missing_wake_signal_never_lets_the_count_reach_zero() -> None:
    policy = homogeneous(0, 5, beh=behavior())
    steps = replay(policy, [Observation({"load": MetricSample(pods=(0.0, 0.0))})] * 2, start=2, wake=Wake("pending"))
    assert replicas(steps) == [1, 1]
    assert "wake signal pending missing" in steps[0].rec.reason


def test_missing_metrics_skip_the_round_or_forbid_a_scale_down() -> None:
    policy = homogeneous(1, 10, metrics={"load": "10", "kv": "800m"}, beh=behavior())
    trace = [ext(load=40, kv=3.2), ext(), ext(kv=0.8), ext(kv=6.4), ext(load=20, kv=1.6), ext(load=50, kv=2.4)]
    steps = replay(policy, trace, start=4)
    assert replicas(steps) == [4, 4, 4, 8, 2, 5]
    assert [s.rec.skipped for s in steps] == [False, True, False, False, False, False]
    assert steps[1].rec.desired is None
    assert "no scale-down on partial data" in steps[2].rec.reason
    assert steps[5].rec.reason.startswith("metric load wants 5")  # the largest of the metrics


def test_a_skipped_round_records_nothing() -> None:
    policy = homogeneous(1, 10, beh=behavior(down={"stabilizationWindow": "60s"}))
    state = ScalerState()
    _, state = recommend_homogeneous(policy, state, ext(load=80), 8, 0.0)
    rec, after = recommend_homogeneous(policy, state, ext(), 8, 15.0)
    assert rec.skipped and rec.replicas == 8 and after is state


def test_a_count_outside_the_bounds_is_brought_back_even_without_metrics() -> None:
    policy = homogeneous(2, 6, beh=behavior())
    assert recommend_homogeneous(policy, ScalerState(), ext(), 1, 0.0)[0].replicas == 2
    assert recommend_homogeneous(policy, ScalerState(), ext(), 9, 0.0)[0].replicas == 6
