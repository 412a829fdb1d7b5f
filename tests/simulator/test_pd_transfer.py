"""PD pieces without a process: KV transfer arithmetic, and the engine's two PD hooks
(a prefill that keeps its KV for a decode, a decode whose prompt KV arrived remotely)."""

import pytest

from loadtest.simulator.clock import VirtualClock
from loadtest.simulator.engine import Engine, EngineConfig, GenRequest
from loadtest.simulator.kv_transfer import (DEFAULT_BANDWIDTH_GBPS, PdSettings, TransferModel,
                                            kv_bytes_per_token)


def test_kv_bytes_per_token_comes_from_the_calibrated_model():
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes (bf16), as the README says
    assert kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072


def test_transfer_moves_whole_blocks():
    t = TransferModel(131_072, block_size=16)
    assert t.kv_bytes(4096) == 4096 * 131_072
    assert t.kv_bytes(17) == 32 * 131_072  # a partial last block travels whole
    assert t.kv_bytes(1) == 16 * 131_072


def test_transfer_time_is_bytes_over_the_link_rate():
    t = TransferModel(131_072, bandwidth_gbps=DEFAULT_BANDWIDTH_GBPS)
    # a 4k-token prompt is 512 MiB of KV: 10.7 ms at 400 Gb/s (vs ~102 ms to prefill it)
    assert t.seconds(t.kv_bytes(4096)) == pytest.approx(4096 * 131_072 * 8 / 400e9)
    assert t.seconds(t.kv_bytes(4096)) == pytest.approx(0.010737, rel=1e-4)
    slow = TransferModel(131_072, bandwidth_gbps=100)
    assert slow.seconds(10**9) == pytest.approx(4 * t.seconds(10**9))
    assert t.seconds(0) == 0


def test_timeouts_default_to_each_engines_own():
    assert PdSettings(flavour="vllm").hold_timeout == 480  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT
    assert PdSettings(flavour="sglang").hold_timeout == 300  # ..._BOOTSTRAP_TIMEOUT
    assert PdSettings(flavour="vllm", hold_timeout_s=2).hold_timeout == 2
    assert PdSettings(time_scale=3).wall(0.5) == 1.5


@pytest.fixture
async def engine_factory():
    engines: list[Engine] = []

    async def make() -> Engine:  # built in the test's own event loop
        e = Engine(EngineConfig(block_size=16, num_gpu_blocks=2048), VirtualClock())
        await e.start()
        engines.append(e)
        return e

    try:
        yield make
    finally:
        for e in engines:
            await e.stop()


async def first_token_time(e: Engine, rid: str, prompt: list[int], **kw) -> float:
    h = e.submit(GenRequest(rid, prompt, 4, **kw))
    _ = [t async for t in h]
    return h.token_times[0] - h.arrival_time


async def test_remote_kv_is_not_prefilled_again(engine_factory):
    engine = await engine_factory()
    prompt = [7] * 4096
    cold = await first_token_time(engine, "cold", prompt)
    other = [9] * 4096  # not in the prefix cache
    remote = await first_token_time(engine, "remote", other, kv_ready_tokens=4096)
    # a 4k prefill is ~102 ms; with the KV in place only the last token is computed
    assert cold > 0.09
    assert remote < cold / 5
    assert remote == pytest.approx(engine.cost.prefill_ms(1, 4095) / 1000)


async def test_held_kv_stays_allocated_until_released(engine_factory):
    engine = await engine_factory()
    used0 = engine.kv.num_free
    h = engine.submit(GenRequest("p", [3] * 100, 1, hold_kv=True))
    _ = [t async for t in h]
    assert h.finish_reason == "length"
    assert len(h.block_ids) == 7  # 100 prompt tokens (+1 sampled) in blocks of 16
    assert engine.kv.num_free == used0 - 7
    h.release_kv()
    assert engine.kv.num_free == used0 and h.block_ids == []
    h.release_kv()  # idempotent
    assert engine.kv.num_free == used0


async def test_aborted_hold_request_frees_at_once(engine_factory):
    engine = await engine_factory()
    used0 = engine.kv.num_free
    h = engine.submit(GenRequest("p", [4] * 100, 50, hold_kv=True))
    async for _ in h:
        break
    h.abort()  # the client went away (the server aborts an unfinished handle)
    assert h.finish_reason == "abort"
    assert engine.kv.num_free == used0
