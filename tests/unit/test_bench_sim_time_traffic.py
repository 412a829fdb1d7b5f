"""The benchmark gives the router its default deadlines in simulated time (the engines run
`time_scale` times slower than wall time), through the router's own configuration loader."""

from pathlib import Path

from kthena_router.config.traffic import DEFAULT_TRAFFIC
from kthena_router.scheduling.check import validate_router_configuration
from loadtest.shared_prefix import cluster

BEST = Path(__file__).resolve().parents[2] / "configs/scheduling/best.yaml"


def _load(tmp_path: Path, text: str):
    f = tmp_path / "rc.yaml"
    f.write_text(text)
    return validate_router_configuration(str(f))


def test_defaults_scaled_by_the_time_scale(tmp_path: Path) -> None:
    base = BEST.read_text()
    rc = _load(tmp_path, cluster.with_sim_time_traffic(base, 16))
    d, got = DEFAULT_TRAFFIC.defaults, rc.traffic.defaults
    assert got.timeouts.first_token_s == d.timeouts.first_token_s * 16
    assert got.timeouts.idle_s == d.timeouts.idle_s * 16
    assert got.timeouts.response_s == d.timeouts.response_s * 16
    assert got.timeouts.total_s == d.timeouts.total_s  # off stays off
    assert got.timeouts.connect_s == d.timeouts.connect_s  # a local handshake, not engine time
    assert got.outlier.stall_min_s == d.outlier.stall_min_s * 16
    assert got.outlier.max_ejection_s == d.outlier.max_ejection_s * 16
    assert got.outlier.consecutive_failures == d.outlier.consecutive_failures
    assert rc.warnings == ()
    # the scheduler is the policy's, unchanged
    assert _load(tmp_path, base).scheduler == rc.scheduler


def test_with_the_shared_index_section_too(tmp_path: Path) -> None:
    text = cluster.with_sim_time_traffic(cluster.with_shared_index(BEST.read_text(), "127.0.0.1:1", "600ms"), 12)
    rc = _load(tmp_path, text)
    assert rc.traffic.defaults.timeouts.first_token_s == DEFAULT_TRAFFIC.defaults.timeouts.first_token_s * 12


def test_a_policys_own_traffic_section_is_kept(tmp_path: Path) -> None:
    own = BEST.read_text() + "traffic:\n  timeouts: {firstToken: 7s}\n"
    assert cluster.with_sim_time_traffic(own, 16) == own
    assert _load(tmp_path, own).traffic.defaults.timeouts.first_token_s == 7.0
