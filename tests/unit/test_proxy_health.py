"""Outlier detection (consecutive failures, failure rate over an interval), capped
exponential backoff, re-admission by the active probe, stall tracking. Injected clock."""

from __future__ import annotations

import pytest

from kthena_router.config.traffic import OutlierDetection
from kthena_router.endpoints.health import EndpointHealth, Failure
from kthena_router.endpoints.outlier import FailureWindow

BASE, MAX = 1.0, 30.0


def _health(**kw: object) -> EndpointHealth:
    fields = {"consecutive_failures": 3, "failure_rate_percent": None, "base_ejection_s": BASE,
              "max_ejection_s": MAX} | kw
    return EndpointHealth(policy=OutlierDetection(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(Failure))
def test_every_failure_kind_ejects_after_consecutive_threshold_only(kind: Failure) -> None:
    changes: list[bool] = []
    eh = _health()
    eh.on_change = changes.append
    assert not eh.record_failure(kind, now=100.0)
    assert not eh.record_failure(kind, now=100.0)
    assert eh.healthy and changes == []
    assert eh.record_failure(kind, now=100.0)
    assert not eh.healthy and changes == [False]
    eh.probe_result(True, now=100.0 + BASE / 2)  # too early
    assert not eh.healthy and not eh.probe_due(100.0 + BASE / 2)
    assert eh.probe_due(100.0 + BASE)
    eh.probe_result(True, now=100.0 + BASE)
    assert eh.healthy and changes == [False, True]


def test_success_resets_the_consecutive_run() -> None:
    eh = _health()
    for t in range(20):
        eh.record_failure(Failure.TIMEOUT, now=float(t))
        eh.record_failure(Failure.CONNECT, now=float(t))
        eh.record_success(now=float(t))
    assert eh.healthy


def test_poison_request_cannot_eject_the_fleet() -> None:
    """One request failing on every engine (retried across them) adds one failure each."""
    fleet = [EndpointHealth() for _ in range(3)]  # built-in defaults
    for eh in fleet:
        eh.record_failure(Failure.HTTP_5XX, now=0.0)
    assert all(eh.healthy for eh in fleet)


def test_failure_rate_over_the_interval_with_minimum_requests() -> None:
    eh = _health(consecutive_failures=100, failure_rate_percent=50.0, failure_rate_min_requests=10,
                 interval_s=10.0)
    t = 0.0
    for _ in range(4):  # 8 outcomes, half failed: below the minimum count
        eh.record_success(now=t)
        assert not eh.record_failure(Failure.HTTP_5XX, now=t)
        t += 0.5
    eh.record_success(now=t)
    assert eh.record_failure(Failure.HTTP_5XX, now=t)  # 10 outcomes, 50% failed
    assert not eh.healthy


def test_failures_older_than_the_interval_do_not_count() -> None:
    eh = _health(consecutive_failures=100, failure_rate_percent=50.0, failure_rate_min_requests=8,
                 interval_s=10.0)
    for _ in range(3):
        eh.record_failure(Failure.TIMEOUT, now=0.0)
        eh.record_success(now=0.0)
    # 30 s later the old outcomes are gone (with them it would be 4 failures of 8)
    eh.record_success(now=30.0)
    assert not eh.record_failure(Failure.TIMEOUT, now=30.0)
    assert eh.healthy
    # a low rate with enough outcomes does not eject either
    for _ in range(10):
        eh.record_success(now=31.0)
    assert not eh.record_failure(Failure.TIMEOUT, now=31.0)


def test_failure_window_counts() -> None:
    w = FailureWindow(10.0)
    w.record(0.0, True)
    w.record(5.0, False)
    w.record(9.9, True)
    assert w.counts(9.9) == (3, 2)
    assert w.counts(10.5) == (2, 1)  # the bucket of t=0 left the interval
    assert w.counts(100.0) == (0, 0)


def test_backoff_doubles_per_consecutive_ejection_and_is_capped() -> None:
    eh = _health(consecutive_failures=1)
    now = 0.0
    periods = []
    for _ in range(10):  # fails traffic, passes the probe, fails again, ...
        assert eh.record_failure(Failure.CONNECT, now=now)
        periods.append(eh.ejected_until - now)
        now = eh.ejected_until
        eh.probe_result(True, now=now)
        assert eh.healthy
    assert periods[:3] == [BASE, 2 * BASE, 4 * BASE]
    assert max(periods) == MAX


def test_failed_probes_keep_an_ejected_endpoint_out_without_growing_backoff() -> None:
    eh = _health(consecutive_failures=1)
    eh.record_failure(Failure.TIMEOUT, now=0.0)
    for t in (1.0, 5.0, 50.0):
        eh.probe_result(False, now=t)
        assert not eh.healthy
    assert eh.ejections == 1
    eh.probe_result(True, now=51.0)
    assert eh.healthy


def test_success_after_readmission_resets_backoff() -> None:
    eh = _health(consecutive_failures=1)
    eh.record_failure(Failure.INVALID, now=0.0)
    eh.probe_result(True, now=eh.ejected_until)
    eh.record_success(now=eh.ejected_until)
    eh.record_failure(Failure.DIED, now=1000.0)
    assert eh.ejected_until == 1000.0 + BASE


def test_failed_probe_of_healthy_endpoint_ejects() -> None:
    eh = _health()
    eh.probe_result(False, now=5.0)
    assert not eh.healthy and eh.ejected_until == 5.0 + BASE


# --- stall tracking -----------------------------------------------------------------------

def test_a_stalled_attempt_counts_once_and_blocks_until_progress() -> None:
    eh = _health(stall_min_s=2.0, stall_factor=4.0)
    judged: list[int] = []
    eh.on_stalled = judged.append
    p = eh.begin(now=0.0)
    assert eh.usable(1.9)  # still within stallMinimum
    assert not eh.usable(2.1)  # judged stalled: no progress since it was sent
    assert judged == [1] and eh.consecutive == 1 and eh.healthy
    assert not eh.usable(3.0) and judged == [1]  # judged once
    eh.finish(p, Failure.TIMEOUT, now=10.0)  # its timeout is not a second failure
    assert eh.consecutive == 1
    assert eh.usable(10.0)  # nothing stalled in flight any more


def test_later_progress_outweighs_an_older_stalled_attempt() -> None:
    eh = _health(stall_min_s=2.0)
    slow = eh.begin(now=0.0)
    assert not eh.usable(3.0)
    fast = eh.begin(now=3.0)
    eh.first_byte(fast, now=3.1)  # the engine answers newer work: it is making progress
    assert eh.usable(3.2)
    eh.finish(fast, now=3.5)
    eh.abandon(slow)  # client left: no outcome of the endpoint's
    assert eh.consecutive == 0


def test_stall_threshold_follows_recent_ttft() -> None:
    eh = _health(stall_min_s=0.5, stall_factor=4.0, consecutive_failures=100)
    for i in range(30):  # the endpoint's first bytes take 1 s
        p = eh.begin(now=float(i))
        eh.first_byte(p, now=i + 1.0)
        eh.finish(p, now=i + 1.0)
    assert eh.stall.ttft == pytest.approx(1.0)
    eh.begin(now=100.0)
    assert eh.usable(103.9)  # under 4 x 1 s
    assert not eh.usable(104.1)


def test_stalls_reach_the_consecutive_threshold() -> None:
    eh = _health(stall_min_s=1.0)
    for i in range(3):
        eh.begin(now=float(i) / 10)
    assert not eh.usable(5.0)
    assert not eh.healthy  # three stalled attempts = three consecutive failures


def test_finish_is_idempotent_and_success_counts() -> None:
    eh = _health()
    eh.record_failure(Failure.TIMEOUT, now=0.0)
    p = eh.begin(now=0.0)
    eh.first_byte(p, now=0.1)
    eh.finish(p, now=0.2)
    assert eh.consecutive == 0
    eh.finish(p, Failure.DIED, now=0.3)  # already finished: ignored
    eh.abandon(p)
    assert eh.consecutive == 0 and not eh.stall.waiting and not eh.stall.stalled


def test_an_abandoned_attempt_that_waited_too_long_counts_as_a_stall() -> None:
    eh = _health(stall_min_s=2.0)
    judged: list[int] = []
    eh.on_stalled = judged.append
    quick = eh.begin(now=0.0)
    eh.abandon(quick, now=1.0)  # the client left early: no outcome
    assert eh.consecutive == 0
    slow = eh.begin(now=10.0)
    eh.abandon(slow, now=15.0)  # the client gave up after 5 s without a byte
    assert eh.consecutive == 1 and judged == [1]


def test_readmitted_endpoint_gets_one_attempt_until_its_first_byte() -> None:
    eh = _health(consecutive_failures=1)
    eh.record_failure(Failure.TIMEOUT, now=0.0)
    eh.probe_result(True, now=BASE)
    assert eh.healthy and eh.usable(BASE)
    trial = eh.begin(now=BASE)
    assert not eh.usable(BASE + 0.1)  # one attempt out, no byte yet
    eh.first_byte(trial, now=BASE + 0.2)
    assert eh.usable(BASE + 0.2)
    eh.begin(now=BASE + 0.3)
    assert eh.usable(BASE + 0.4)  # off trial: any number in flight


def test_a_stall_puts_the_endpoint_on_trial() -> None:
    eh = _health(stall_min_s=2.0, consecutive_failures=100)
    eh.abandon(eh.begin(now=0.0), now=5.0)  # gave up on after 5 s without a byte
    assert eh.trial and eh.usable(5.0)  # nothing in flight: one attempt may go
    probe = eh.begin(now=5.0)
    assert not eh.usable(5.1)
    eh.first_byte(probe, now=5.2)
    assert not eh.trial and eh.usable(5.2)


def test_a_slow_attempt_on_a_progressing_engine_does_not_put_it_on_trial() -> None:
    eh = _health(stall_min_s=2.0, consecutive_failures=100)
    slow = eh.begin(now=0.0)
    quick = eh.begin(now=1.0)
    eh.first_byte(quick, now=1.1)
    assert eh.usable(3.0)  # slow is judged (one failure) but the engine answered since
    assert eh.consecutive == 1 and not eh.trial
    eh.abandon(slow, now=6.0)
    assert eh.consecutive == 1 and not eh.trial
