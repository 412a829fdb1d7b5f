"""A router that has just started scrapes every engine at once, not at a random point of the
scrape interval: until its first scrape an engine's load is unknown, which ranks it worst,
so a new router (a restarted replica in a rolling update) would keep traffic and its
prefixes off the engines it had not scraped yet. A long interval makes the old behaviour
visible: each first scrape would come at a uniform point of 30 s."""

from __future__ import annotations

from pathlib import Path

import harness

STALE = "kthena_router_endpoint_metrics_stale"
LEAST_REQUEST = "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: least-request, weight: 1}\n"


def test_every_engine_is_scraped_right_after_start(tmp_path: Path) -> None:
    with harness.start_simulator(tmp_path, engines=3, fast=True) as sim:
        config = harness.write_config(tmp_path / "routes.yaml", harness.engine_config(sim.ports))
        rc = tmp_path / "router-config.yaml"
        rc.write_text(LEAST_REQUEST)  # a load-aware pipeline: the router scrapes the engines
        with harness.start_router(config, tmp_path,
                                  extra_args=["--router-config", str(rc), "--scrape-interval-s", "30"]) as router:
            eps = {f"127.0.0.1:{p}" for p in sim.ports}

            def fresh() -> bool:
                fams = harness.parse_metrics(router.metrics_text())
                seen = {s.labels["endpoint"]: s.value for f in fams.values() for s in f.samples if s.name == STALE}
                return all(seen.get(ep) == 0 for ep in eps)

            harness.wait_until(fresh, 10, what="a first scrape of every engine")
            assert all(sim.state(i)["polls"]["metrics"] >= 1 for i in range(3))  # the engines saw it
