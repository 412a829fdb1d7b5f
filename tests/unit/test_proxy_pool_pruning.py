"""Pod churn: a state swap prunes the upstream pool to the live endpoints (app wiring)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from kthena_router.app import ConfigApplier, pool_pruner
from kthena_router.config.loader import load_config_bytes
from kthena_router.config.traffic import DEFAULT_TRAFFIC, ServerTraffic, Timeouts, TrafficSettings
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.upstream import H1Pool
from kthena_router.settings import RouterSettings
from kthena_router.state import StateHolder

_CONFIG = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: demo}
spec:
  modelName: demo
  rules: [{name: default, targetModels: [{modelServerName: demo}]}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: demo}
spec:
  model: demo
  inferenceEngine: vLLM
  workloadSelector: {matchLabels: {app: demo}}
  workloadPort: {port: 8000}
---
apiVersion: router.kthena.io/v1alpha1
kind: Endpoints
metadata: {name: engines}
spec:
  endpoints:
"""


def _cfg(ports: list[int]):
    text = _CONFIG + "".join(f"  - {{address: 127.0.0.1, port: {p}, labels: {{app: demo}}}}\n" for p in ports)
    return load_config_bytes(text.encode(), "test.yaml", None)


def _applier() -> tuple[ConfigApplier, StateHolder]:
    holder = StateHolder()
    applier = ConfigApplier(RouterSettings(config_path="test.yaml"), holder, EndpointRegistry(),
                            RouterMetrics(CollectorRegistry()))
    return applier, holder


def test_endpoints_leaving_the_config_leave_the_pool() -> None:
    async def main() -> None:
        pool = H1Pool(8)
        applier, holder = _applier()
        applier.after_swap.append(pool_pruner(lambda: pool))
        await applier.apply(_cfg([9001, 9002, 9003]))
        for eps in holder.current.targets.values():
            for ep in eps:  # what requests do: one destination per endpoint used
                pool.dest(ep.ip, ep.port, ep.ssl, ep.server_hostname, ep.host)
        assert pool.destinations == 3
        for n in range(20):  # churn: a new pod address per reload, one old one stays
            await applier.apply(_cfg([9001, 10000 + n]))
            for ep in holder.current.targets[("default", "demo")]:
                pool.dest(ep.ip, ep.port, ep.ssl, ep.server_hostname, ep.host)
        assert pool.destinations == 2
        await pool.close()

    asyncio.run(main())


def test_traffic_is_resolved_per_state_and_set_traffic_swaps() -> None:
    async def main() -> None:
        applier, holder = _applier()
        await applier.apply(_cfg([9001]))
        key = ("default", "demo")
        assert holder.current.traffic_of(key) == DEFAULT_TRAFFIC.defaults
        short = ServerTraffic(timeouts=Timeouts(first_token_s=1.0))
        before = holder.current
        applier.set_traffic(TrafficSettings(overrides={"default/demo": short}))
        assert holder.current is not before
        assert holder.current.traffic_of(key).timeouts.first_token_s == 1.0
        assert holder.current.traffic_of(("default", "other")) == DEFAULT_TRAFFIC.defaults

    asyncio.run(main())
