"""`kthena-controller`, the console script `make build` installs (the Deployment runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_console_script_runs_the_controller_cli() -> None:
    script = Path(sys.executable).parent / "kthena-controller"
    assert script.is_file(), f"{script} missing: run `make build`"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--kubeconfig" in out.stdout and "--leader-elect" in out.stdout
    bad = subprocess.run([str(script), "--workers", "x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--workers" in bad.stderr
