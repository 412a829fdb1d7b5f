"""A real Prometheus server (Debian's `prometheus`) on a free loopback port, for tests.

`make test` installs it when it is missing (Makefile target `prometheus`). The package may
start a system service of its own (port 9090, its own data directory): it is never used.
Each test server runs from the test's log directory: its own config (static scrape targets
on 127.0.0.x, a short scrape interval), its own TSDB directory, a free port; it dies with
the test.

Import as `import prometheus_harness` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

import harness

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class PrometheusServer:
    def __init__(self, log_dir: Path, targets: Sequence[str], *, scrape_interval: str = "1s",
                 port: int | None = None) -> None:
        """`targets`: host:port of the /metrics pages to scrape (job `engines`)."""
        self.log_dir = log_dir
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.port = port or harness.free_port()
        self.process: harness.ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The serverURL of a `metricSources[...].prometheus`."""
        return f"http://{harness.HOST}:{self.port}"

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        config = self.log_dir / f"prometheus-{self.port}.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [{"job_name": "engines", "scrape_interval": self.scrape_interval,
                                "scrape_timeout": self.scrape_interval, "metrics_path": "/metrics",
                                "static_configs": [{"targets": self.targets}]}]}))
        data = self.log_dir / f"prometheus-data-{self.port}"
        data.mkdir(exist_ok=True)
        argv = [PROMETHEUS, f"--config.file={config}", f"--web.listen-address={harness.HOST}:{self.port}",
                f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=1h", "--log.level=warn"]
        self.process = harness.ManagedProcess("prometheus", argv, self.log_dir)
        harness.wait_until(self._up, timeout, interval=0.1, what=f"prometheus on {self.port}")
        return self

    def _up(self) -> bool:
        assert self.process is not None
        if not self.process.alive():
            raise RuntimeError(f"prometheus exited with {self.process.returncode}\n{self.process.tail()}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, promql: str) -> dict[str, Any]:
        """The raw /api/v1/query response document (for waits; the code under test has its own client)."""
        return httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5).json()

    def targets_up(self) -> bool:
        """Every target scraped successfully at least once."""
        body = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()
        active = body.get("data", {}).get("activeTargets", [])
        return len(active) == len(self.targets) and all(t.get("health") == "up" for t in active)

    def wait_targets_up(self, timeout: float = 30.0) -> None:
        harness.wait_until(self.targets_up, timeout, interval=0.2, what=f"prometheus targets {self.targets} up")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start_prometheus(log_dir: Path, targets: Sequence[str], **kwargs: Any) -> PrometheusServer:
    return PrometheusServer(log_dir, targets, **kwargs).start()


@contextmanager
def scraped_simulator(log_dir: Path, engines: int, extra_args: Sequence[str] = ()
                      ) -> Iterator[tuple[harness.Simulator, PrometheusServer]]:
    """Engine simulators (python -m loadtest.simulator, vLLM pages) and a server scraping
    all of them, every target up once; both stopped on exit."""
    sim = harness.start_simulator(log_dir, engines=engines, extra_args=extra_args)
    prom = None
    try:
        prom = start_prometheus(log_dir, [f"{harness.HOST}:{p}" for p in sim.ports])
        prom.wait_targets_up()
        yield sim, prom
    finally:
        if prom is not None:
            prom.stop()
        sim.stop()
