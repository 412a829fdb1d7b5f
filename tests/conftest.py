"""Shared fixtures: real simulator and router processes (see tests/harness.py).

Every test that uses `router_workers` (directly or through `router`) runs once per
worker count: `--router-workers 1,2` (the default; `make test` runs both) or e.g.
`--router-workers 2`. Session-scoped processes are shared to keep the suite fast; tests
that change a router's config or stop it start their own with harness.start_router.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

DEMO_LORA = ("demo-lora-a", "demo-lora-b")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--router-workers",
        default="1,2",
        help="comma-separated granian worker counts the integration suite runs with (default 1,2)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "router_workers" in metafunc.fixturenames:
        raw = metafunc.config.getoption("--router-workers")
        counts = [int(x) for x in str(raw).split(",") if x.strip()]
        metafunc.parametrize("router_workers", counts, scope="session", ids=[f"w{n}" for n in counts])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        start = time.time() - (call.duration or 0) - 1
        for proc in harness.ALL_PROCESSES:
            if proc.stopped_at is None or proc.stopped_at >= start:
                report.sections.append((f"process {proc.name} pid {proc.pid}", proc.tail(80)))


@pytest.fixture(scope="session")
def proc_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory for the shared processes' output files."""
    return tmp_path_factory.mktemp("procs")


@pytest.fixture(scope="session")
def simulator_session(proc_logs: Path) -> Iterator[harness.Simulator]:
    """3 vLLM-flavoured engines serving `demo` with two LoRA adapters, shared by the session."""
    with harness.start_simulator(proc_logs, engines=3, model="demo", lora=DEMO_LORA) as sim:
        yield sim


@pytest.fixture
def simulator(simulator_session: harness.Simulator) -> Iterator[harness.Simulator]:
    """The shared simulator with faults and request logs cleared before (faults also after)."""
    simulator_session.reset_faults()
    simulator_session.reset_requests()
    yield simulator_session
    simulator_session.reset_faults()


@pytest.fixture(scope="session")
def router_session(
    router_workers: int, simulator_session: harness.Simulator, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.Router]:
    """A router per worker count in front of the shared simulator (do not stop or reconfigure)."""
    work = tmp_path_factory.mktemp(f"router-w{router_workers}")
    config = harness.write_config(
        work / "router.yaml", harness.engine_config(simulator_session.ports, lora=DEMO_LORA)
    )
    with harness.start_router(config, work, workers=router_workers) as router:
        yield router


@pytest.fixture
def router(router_session: harness.Router, simulator: harness.Simulator) -> harness.Router:
    """The shared router; the simulator behind it is reset for this test."""
    assert router_session.process.alive(), router_session.process.tail()
    return router_session
