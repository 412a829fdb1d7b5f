"""Cost model: interpolation over the calibration table, mixed steps, extrapolation."""

import json

import pytest

from loadtest.simulator.cost_model import DEFAULT_CALIBRATION, CostModel, PiecewiseLinear


@pytest.fixture(scope="module")
def table() -> dict:
    with open(DEFAULT_CALIBRATION, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def model(table) -> CostModel:
    return CostModel(table)


def test_shipped_calibration_is_the_shared_file(table):
    with open("/work/shared/calibration/h200-llama3-8b.json", encoding="utf-8") as f:
        assert json.load(f) == table


def test_piecewise_linear_clamps_below_and_extrapolates_beyond():
    f = PiecewiseLinear.through([(10, 1.0), (20, 3.0), (40, 4.0)])
    assert f(0) == 1.0 and f(10) == 1.0
    assert f(15) == pytest.approx(2.0)
    assert f(30) == pytest.approx(3.5)
    assert f(60) == pytest.approx(5.0)  # last slope 0.05
    g = PiecewiseLinear.through([(0, 0.0), (10, 2.0), (20, 6.0)], tail="origin")
    assert g(40) == pytest.approx(6.0 + 20 * 0.3)


def test_table_points_are_reproduced(model, table):
    for r in table["decode"]:
        assert model.decode_ms(r["batch"], r["context"]) == pytest.approx(r["ms_per_step"])
    for r in table["prefill"]:
        if r["batch"] == 1:
            assert model.cold_prefill_ms(r["new_tokens"]) == pytest.approx(r["ms"])


def test_decode_interpolates_between_rows_and_grows_with_batch_and_context(model):
    mid = model.decode_ms(64, 3072)
    assert model.decode_ms(64, 2048) < mid < model.decode_ms(64, 4096)
    assert mid == pytest.approx((9.805 + 13.477) / 2)
    for ctx in (256, 512, 3000, 8192, 20000):
        series = [model.decode_ms(b, ctx) for b in (1, 8, 32, 64, 128, 256, 512)]
        assert series == sorted(series) and series[-1] > series[0]
    for b in (1, 16, 256):
        series = [model.decode_ms(b, c) for c in (512, 1024, 4096, 8192, 16384, 65536)]
        assert series == sorted(series)
    # beyond the table: linear in context from the 4096->8192 difference
    d4, d8 = model.decode_ms(32, 4096), model.decode_ms(32, 8192)
    assert model.decode_ms(32, 16384) == pytest.approx(d8 + 2 * (d8 - d4))
    # below the first context row: the 512 row
    assert model.decode_ms(8, 100) == model.decode_ms(8, 512)


def test_prefix_hit_is_about_ten_times_cheaper(model, table):
    hit = model.prefill_ms(64, 4032)
    cold = model.prefill_ms(4096, 0)
    assert cold / hit > 8
    for r in table["prefix_prefill"]:
        # interpolation through the measured rows: within the monotone envelope
        assert model.prefill_ms(r["new_tokens"], r["cached_tokens"]) >= r["ms"] - 1e-6
        assert model.prefill_ms(r["new_tokens"], r["cached_tokens"]) <= r["ms"] * 1.15
    # cached context never makes a chunk cheaper, and more of it costs more
    costs = [model.prefill_ms(2048, c) for c in (0, 2048, 8192, 32768, 131072)]
    assert costs == sorted(costs) and costs[-1] > costs[0] * 1.5


def test_prefill_is_linear_in_tokens_beyond_the_table(model):
    c8, c16 = model.cold_prefill_ms(8192), model.cold_prefill_ms(16384)
    assert model.cold_prefill_ms(32768) == pytest.approx(c16 + 2 * (c16 - c8))
    # below the first row: towards a one-token forward pass == batch-1 decode step
    assert model.cold_prefill_ms(1) == pytest.approx(model.floor_ms)
    assert model.floor_ms < model.cold_prefill_ms(64) < model.cold_prefill_ms(128)


def test_mixed_step_adds_prefill_to_decode_counting_the_weights_once(model):
    d = model.step_seconds(200, 200 * 1000, 0, [])
    p = model.step_seconds(0, 0, 2000, [(2000, 0)])
    mixed = model.step_seconds(200, 200 * 1000, 2000, [(2000, 0)])
    assert mixed == pytest.approx(d + p - model.floor_ms / 1000)
    assert mixed > max(d, p)
    # prefill chunks of one step combine by total tokens (batched-prefill rows)
    two = model.step_seconds(0, 0, 2048, [(1024, 0), (1024, 0)])
    assert two == pytest.approx(model.cold_prefill_ms(2048) / 1000)
    # a chunk on cached context pays the attention surcharge
    assert model.step_seconds(0, 0, 1024, [(1024, 3072)]) > two / 2
    assert model.step_seconds(0, 0, 1024, [(1024, 3072)]) == pytest.approx(
        model.prefill_ms(1024, 3072) / 1000
    )
