"""Passive ejection with capped exponential backoff, re-admission by an active probe."""

from __future__ import annotations

from kthena_router.endpoints import health as h
from kthena_router.endpoints.health import EndpointHealth, Failure


def test_connect_error_ejects_at_once_and_probe_readmits_after_backoff() -> None:
    changes: list[bool] = []
    eh = EndpointHealth(changes.append)
    assert eh.record_failure(Failure.CONNECT, now=100.0)
    assert not eh.healthy and changes == [False]
    eh.probe_result(True, now=100.0 + h.BASE_EJECT_S / 2)  # too early
    assert not eh.healthy
    assert not eh.probe_due(100.0 + h.BASE_EJECT_S / 2)
    assert eh.probe_due(100.0 + h.BASE_EJECT_S)
    eh.probe_result(True, now=100.0 + h.BASE_EJECT_S)
    assert eh.healthy and changes == [False, True]


def test_5xx_ejects_only_after_consecutive_threshold() -> None:
    eh = EndpointHealth()
    for _ in range(h.FIVE_XX_THRESHOLD - 1):
        assert not eh.record_failure(Failure.HTTP_5XX, now=0.0)
    eh.record_success()  # resets the run
    for _ in range(h.FIVE_XX_THRESHOLD - 1):
        assert not eh.record_failure(Failure.HTTP_5XX, now=0.0)
    assert eh.healthy
    assert eh.record_failure(Failure.HTTP_5XX, now=0.0)
    assert not eh.healthy


def test_backoff_grows_for_a_flapping_endpoint_and_is_capped() -> None:
    eh = EndpointHealth()
    now = 0.0
    periods = []
    for _ in range(10):  # fails traffic, passes the probe, fails again, ...
        eh.record_failure(Failure.CONNECT, now=now)
        periods.append(eh.ejected_until - now)
        now = eh.ejected_until
        eh.probe_result(True, now=now)
        assert eh.healthy
    assert periods[:3] == [h.BASE_EJECT_S, 2 * h.BASE_EJECT_S, 4 * h.BASE_EJECT_S]
    assert max(periods) == h.MAX_EJECT_S


def test_failed_probes_keep_an_ejected_endpoint_out_without_growing_backoff() -> None:
    eh = EndpointHealth()
    eh.record_failure(Failure.TIMEOUT, now=0.0)
    for t in (1.0, 5.0, 50.0):
        eh.probe_result(False, now=t)
        assert not eh.healthy
    assert eh.ejections == 1
    eh.probe_result(True, now=51.0)
    assert eh.healthy


def test_success_after_readmission_resets_backoff() -> None:
    eh = EndpointHealth()
    eh.record_failure(Failure.INVALID, now=0.0)
    eh.probe_result(True, now=eh.ejected_until)
    assert eh.healthy
    eh.record_success()
    eh.record_failure(Failure.DIED, now=1000.0)
    assert eh.ejected_until == 1000.0 + h.BASE_EJECT_S


def test_failed_probe_of_healthy_endpoint_ejects() -> None:
    eh = EndpointHealth()
    eh.probe_result(False, now=5.0)
    assert not eh.healthy and eh.ejected_until == 5.0 + h.BASE_EJECT_S
