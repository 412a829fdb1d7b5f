"""The router configuration's scaleFromZero section: defaults, overrides, errors naming the
file, document and field; and the per-worker hold bookkeeping (maxPending share)."""

from __future__ import annotations

import asyncio

import pytest

from kthena_router.config import ConfigError, load_config_bytes
from kthena_router.config.model import ModelServer
from kthena_router.config.scale_from_zero import DEFAULT_SCALE_FROM_ZERO, HoldSettings
from kthena_router.errors import RequestError
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.zero_hold import ZeroHold
from kthena_router.scheduling.config import load_router_configuration_bytes


def load(text: str):  # noqa: ANN201
    return load_router_configuration_bytes(text.encode(), "rc.yaml")


def test_absent_section_means_no_holding() -> None:
    rc = load("scheduler: {}\n")
    assert rc.scale_from_zero == DEFAULT_SCALE_FROM_ZERO
    assert not rc.scale_from_zero.for_server("default", "x").enabled


def test_defaults_and_overrides_by_name_and_namespace() -> None:
    rc = load("scaleFromZero:\n  holdTimeout: 1m\n  maxPending: 10\n  modelServers:\n"
              "    a: {maxPending: 2}\n    prod/b: {holdTimeout: 0s}\n")
    s = rc.scale_from_zero
    assert s.for_server("default", "x") == HoldSettings(60.0, 10)
    assert s.for_server("default", "a") == HoldSettings(60.0, 2)  # the rest from the section's defaults
    assert not s.for_server("prod", "b").enabled
    assert s.for_server("default", "b").enabled


@pytest.mark.parametrize(("text", "field", "words"), [
    ("scaleFromZero: {holdTimeout: 30}\n", "scaleFromZero.holdTimeout", "duration"),
    ("scaleFromZero: {holdTimeout: -1s}\n", "scaleFromZero.holdTimeout", "negative"),
    ("scaleFromZero: {maxPending: 0}\n", "scaleFromZero.maxPending", "between"),
    ("scaleFromZero: {maxPending: many}\n", "scaleFromZero.maxPending", "integer"),
    ("scaleFromZero: {holdTimeot: 1s}\n", "scaleFromZero.holdTimeot", "did you mean"),
    ("scaleFromZero: {modelServers: {a: {maxPending: 0}}}\n", "scaleFromZero.modelServers.a.maxPending", "between"),
    ("scaleFromZero: {modelServers: {off: {}}}\n", "scaleFromZero.modelServers.False", "quote it"),
    ("scaleFromZero: {modelServers: [a]}\n", "scaleFromZero.modelServers", "mapping"),
    ("scaleFromZero: 5\n", "scaleFromZero", "mapping"),
])
def test_invalid_values_name_file_document_and_field(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(text)
    assert exc.value.file == "rc.yaml" and exc.value.field == field, str(exc.value)
    assert exc.value.document and words in exc.value.message


def _server(name: str = "s") -> ModelServer:
    cfg = load_config_bytes(
        b"apiVersion: networking.serving.volcano.sh/v1alpha1\nkind: ModelServer\nmetadata: {name: %s}\n"
        b"spec: {model: m, inferenceEngine: vLLM, workloadSelector: {matchLabels: {app: x}}, "
        b"workloadPort: {port: 8000}}\n" % name.encode(), "c.yaml")
    return next(iter(cfg.servers.values()))


def test_max_pending_is_shared_out_between_workers_and_released() -> None:
    async def run() -> None:
        zh = ZeroHold(RouterMetrics(), workers=2)
        hs = HoldSettings(10.0, 3)  # 2 workers: ceil(3 / 2) = 2 here
        server = _server()
        with zh.hold(server, "default/s", "m", hs), zh.hold(server, "default/s", "m", hs):
            assert zh.held == 2
            with pytest.raises(RequestError) as exc:
                zh.hold(server, "default/s", "m", hs)
            assert exc.value.status == 503 and exc.value.code == "too_many_pending"
        assert zh.held == 0
        with zh.hold(server, "default/s", "m", hs) as h:  # a released slot is free again
            loop = asyncio.get_running_loop()
            waiter = asyncio.ensure_future(h.next_change(loop.time() + 30))
            await asyncio.sleep(0)
            zh.on_state(None)  # a state install wakes it (no polling)
            assert await waiter is True
            assert await h.next_change(loop.time() + 0.01) is False  # no install: the deadline

    asyncio.run(run())
