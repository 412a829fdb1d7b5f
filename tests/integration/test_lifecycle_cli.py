"""`kthena-router` start-up: bad configs and taken ports fail fast with a clear message."""

from __future__ import annotations

import socket
from pathlib import Path

import harness

BAD_WEIGHT = """\
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: s}
spec:
  model: m
  inferenceEngine: vLLM
  workloadSelector: {matchLabels: {app: s}}
  workloadPort: {port: 8000}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: broken}
spec:
  modelName: m
  rules:
  - targetModels:
    - {modelServerName: s, weight: 500}
"""


def _run_cli(tmp_path: Path, config: Path, *extra: str, timeout: float = 60.0) -> harness.ManagedProcess:
    port, admin_port = harness.free_ports(2)
    argv = harness.router_argv(config, port, admin_port, 1, tmp_path / "rt", extra_args=extra)
    proc = harness.ManagedProcess("router-cli", argv, tmp_path)
    try:
        proc.wait(timeout)
    finally:
        proc.kill_group()
    return proc


def test_invalid_config_exits_2_naming_file_document_field(tmp_path: Path) -> None:
    config = harness.write_config(tmp_path / "bad.yaml", BAD_WEIGHT)
    proc = _run_cli(tmp_path, config)
    assert proc.returncode == 2, proc.tail()
    err = proc.stderr()
    assert str(config) in err
    assert "document 2" in err and "ModelRoute" in err and "broken" in err
    assert "spec.rules[0].targetModels[0].weight" in err
    assert "Traceback" not in err


def test_missing_config_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    proc = _run_cli(tmp_path, missing)
    assert proc.returncode == 2, proc.tail()
    assert str(missing) in proc.stderr()
    assert "Traceback" not in proc.stderr()


def test_taken_port_is_reported(tmp_path: Path) -> None:
    config = harness.write_config(tmp_path / "ok.yaml", harness.engine_config([harness.free_port()]))
    with socket.socket() as blocker:
        blocker.bind((harness.HOST, 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        admin_port = harness.free_port()
        argv = harness.router_argv(config, taken, admin_port, 1, tmp_path / "rt")
        proc = harness.ManagedProcess("router-port", argv, tmp_path)
        try:
            proc.wait(60)
        finally:
            proc.kill_group()
    assert proc.returncode == 3, proc.tail()
    assert f"127.0.0.1:{taken} is already in use" in proc.stderr()
    assert "Traceback" not in proc.stderr()


def test_bad_settings_exit_2(tmp_path: Path) -> None:
    config = harness.write_config(tmp_path / "ok.yaml", harness.engine_config([harness.free_port()]))
    proc = _run_cli(tmp_path, config, "--workers", "0")
    assert proc.returncode == 2, proc.tail()
    assert "workers must be >= 1" in proc.stderr()


# kvConnector without pdGroup would have no effect: refused
KV_CONNECTOR = BAD_WEIGHT.replace("weight: 500}", "weight: 100}").replace(
    "  workloadPort: {port: 8000}\n", "  workloadPort: {port: 8000}\n  kvConnector: {type: nixl}\n")


def test_ineffective_kthena_field_exits_2_naming_it(tmp_path: Path) -> None:
    config = harness.write_config(tmp_path / "pd.yaml", KV_CONNECTOR)
    proc = _run_cli(tmp_path, config)
    assert proc.returncode == 2, proc.tail()
    err = proc.stderr()
    assert f"{config}: document 1 (ModelServer default/s): spec.kvConnector: kvConnector takes effect only" in err, err
    assert "Traceback" not in err


def test_hmac_algorithm_in_auth_exits_2_naming_it(tmp_path: Path) -> None:
    config = harness.write_config(tmp_path / "ok.yaml", BAD_WEIGHT.replace("weight: 500", "weight: 100"))
    rc = tmp_path / "router-config.yaml"
    rc.write_text("auth: {issuer: https://issuer.example, jwksUri: https://issuer.example/jwks, algorithms: [HS256]}\n")
    proc = _run_cli(tmp_path, config, "--router-config", str(rc))
    assert proc.returncode == 2, proc.tail()
    err = proc.stderr()
    assert f"{rc}: document 1: auth.algorithms[0]: must be one of" in err and "HMAC" in err, err
