"""The PD pairer follows router-configuration reloads (the pd section) and engine
snapshots through the RouterConfigReloader, as app.py wires it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pd_fixtures import KEY, ep, pd_state
from prometheus_client import CollectorRegistry

from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import RouterMetrics
from kthena_router.pd.pairing import PdPairer
from kthena_router.router_config_reload import RouterConfigReloader
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.settings import RouterSettings
from kthena_router.state import StateHolder

BASE = "scheduler: {plugins: {Score: {enabled: [{name: least-request, weight: 1}]}}}\n"


def rc(text: str):
    return load_router_configuration_bytes(text.encode(), source="rc.yaml")


def wired(tmp_path: Path, text: str) -> tuple[RouterConfigReloader, PdPairer, object]:
    state = pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9002, "a", "decode"), ep(9003, "a", "decode")])
    holder = StateHolder()
    holder.install(state, 0)
    metrics = RouterMetrics(CollectorRegistry())
    first = rc(text)
    reloader = RouterConfigReloader(RouterSettings(config_path="unused"), metrics, first, holder)
    pairer = PdPairer(first.pd, metrics, scraped=True)
    reloader.pd_pairer = pairer
    reloader.on_state(state)
    pairer.on_state(state)  # app.py: applier.after_swap
    return reloader, pairer, state


def test_a_pd_only_change_keeps_the_scheduler_and_installs_at_once(tmp_path: Path) -> None:
    reloader, pairer, _ = wired(tmp_path, BASE)
    live, decode = reloader.scheduler, pairer.decode.inner
    newer = rc(BASE + "pd: {minUncachedTokens: 128, decode: {plugins: {Score: {enabled: [{name: gpu-usage, weight: 1}]}}}}\n")
    reloader.on_config(newer)
    assert reloader.holder.current is newer and reloader.scheduler is live
    assert pairer.settings is newer.pd and pairer.decode.inner is not decode
    assert pairer.settings.for_server(*KEY).min_uncached_tokens == 128


def test_a_scheduler_change_with_a_pd_change_installs_both_together(tmp_path: Path) -> None:
    async def run() -> None:
        reloader, pairer, _ = wired(tmp_path, BASE)
        live = reloader.scheduler
        newer = rc("pd: {minUncachedTokens: 7}\n")  # the scheduler section goes back to its default
        reloader.on_config(newer)
        assert pairer.settings is not newer.pd  # not before the new scheduler is ready
        await asyncio.gather(*reloader._tasks)
        assert reloader.scheduler is not live and pairer.settings is newer.pd

    asyncio.run(run())


def test_snapshots_reach_the_pairer(tmp_path: Path) -> None:
    reloader, pairer, state = wired(tmp_path, BASE)
    for port, running in ((9001, 0), (9002, 9), (9003, 1)):
        reloader._on_snapshot(EndpointSnapshot(f"127.0.0.1:{port}", "vllm", 1.0, 1.0, False, 0, None,
                                               last_running=running, last_waiting=0, last_kv_usage=0.2))
    info = None
    pairs = pairer.pairs(state.pd[KEY], info, pairer.settings.for_server(*KEY))
    assert [(x.decode.port, x.prefill.port) for x in pairs] == [(9003, 9001), (9002, 9001)]
    assert pairer.decode.inner.signals((*KEY, "decode"), "127.0.0.1:9002")["running"] == 9
