"""The Redis test server starts, answers, dies and comes back on the same port."""

from __future__ import annotations

from pathlib import Path

import redis

import redis_harness


def test_redis_server_kill_and_restart(tmp_path: Path) -> None:
    srv = redis_harness.start_redis(tmp_path)
    try:
        r = redis.Redis(host="127.0.0.1", port=srv.port, socket_timeout=2)
        assert r.set("k", "v") and r.get("k") == b"v"
        srv.kill()
        try:
            r.ping()
            raise AssertionError("ping succeeded against a killed server")
        except redis.ConnectionError:
            pass
        srv.start()
        assert r.ping() and r.get("k") is None  # no persistence: a fresh server
    finally:
        srv.stop()
