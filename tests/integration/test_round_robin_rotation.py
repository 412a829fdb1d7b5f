"""Round robin without a router configuration is exact per worker whichever side decides a
request: the Rust front's own table decisions and Python's (a request the table does not
cover) advance one shared rotation, and a config reload (a new table in the front) does not
restart it. Before, each had its own count, so one Python decision or one reload between
front decisions sent one engine an extra request (the Kubernetes-mode test saw 5/3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import pytest

MSGS = [{"role": "user", "content": "hi"}]
TABLE = "kthena_router_front_table_decisions_total"


@pytest.fixture
def two_engines(simulator: harness.Simulator, tmp_path: Path) -> Iterator[tuple[harness.Router, Path, list]]:
    docs = harness.engine_config(simulator.ports[:2])
    config = harness.write_config(tmp_path / "router.yaml", docs)
    router = harness.start_router(config, tmp_path, workers=1)  # the rotation is per worker
    try:
        yield router, config, docs
    finally:
        router.stop()


def _table_decisions(router: harness.Router) -> float:
    try:
        return harness.metric_value(harness.parse_metrics(router.metrics_text()), TABLE)
    except (KeyError, ValueError, AssertionError):
        return 0.0


def _front_chats(router: harness.Router, n: int) -> None:
    client = router.openai()
    for _ in range(n):
        assert client.chat.completions.create(model="demo", messages=MSGS, max_tokens=2).choices[0].message.content


def _python_chat(router: harness.Router) -> None:
    # a query string is outside the front's table: Python decides (front/table.rs `decide`)
    r = httpx.post(f"{router.openai_url}/chat/completions", params={"trace": "1"},
                   json={"model": "demo", "messages": MSGS, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text


def test_python_and_front_decisions_share_one_rotation(two_engines: tuple[harness.Router, Path, list],
                                                       simulator: harness.Simulator) -> None:
    router, _, _ = two_engines
    _front_chats(router, 2)  # the table is installed and taking decisions
    harness.wait_until(lambda: _table_decisions(router) >= 2, 10, what="the front deciding from its table")
    simulator.reset_requests()
    before = _table_decisions(router)
    _python_chat(router)
    _front_chats(router, 7)
    harness.wait_until(lambda: _table_decisions(router) >= before + 7, 10, what="7 table decisions reported")
    assert _table_decisions(router) == before + 7  # the other one was Python's
    got = simulator.received()
    assert got[:2] == [4, 4] and got[2] == 0, got


def test_a_reload_does_not_restart_the_rotation(two_engines: tuple[harness.Router, Path, list],
                                                simulator: harness.Simulator) -> None:
    router, config, docs = two_engines
    _front_chats(router, 2)
    harness.wait_until(lambda: _table_decisions(router) >= 2, 10, what="the front deciding from its table")
    simulator.reset_requests()
    _front_chats(router, 3)  # an odd count: a rotation restarted at the reload would repeat engine 0
    docs = [*docs, harness.route_doc("other", "other-model", "demo")]  # a new config, the same server
    harness.write_config(config, docs)
    assert router.reload().status_code == 200
    before = _table_decisions(router)
    _front_chats(router, 5)
    harness.wait_until(lambda: _table_decisions(router) >= before + 5, 10, what="the new table deciding")
    got = simulator.received()
    assert got[:2] == [4, 4] and got[2] == 0, got
