"""The Dockerfile's steps without a container engine: the build stage's COPY lines (minus
.dockerignore) are copied to a temporary source tree, and the script its RUN lines call
(scripts/image-build.sh) builds the wheel there with maturin, installs it into a fresh venv
and verifies it; then the installed router serves a chat completion from the simulator.

Slow: maturin compiles the Rust extension. Cargo's build directory is kept under the
repository's target/image (incremental after the first run; cold about 1.5 min on 2 cores).
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness

REPO = harness.REPO
SCRIPT = "scripts/image-build.sh"
STAGES = ("toolchain", "wheel", "install", "verify")


def _instructions() -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    out: list[tuple[str, str, str]] = []
    stage, buf = "", ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line, buf = buf + line, ""
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            stage = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else parts[0]
        out.append((stage, word, rest.strip()))
    return out


def _ignored(rel: Path, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(part, p) for part in rel.parts for p in patterns)


def _copy_build_context(dest: Path) -> None:
    """What the build stage's COPY lines put under WORKDIR, with .dockerignore applied."""
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    copies = [rest for stage, word, rest in _instructions() if stage == "build" and word == "COPY"]
    assert copies, "the build stage copies nothing"
    for rest in copies:
        *sources, target = shlex.split(rest)
        assert not any(s.startswith("--") for s in sources), f"unexpected COPY option in {rest!r}"
        for src in sources:
            path = REPO / src
            assert path.exists(), f"Dockerfile copies {src}, which does not exist"
            to = dest / target if not target.endswith("/") and len(sources) == 1 else dest / target / path.name
            if target in ("./", "."):
                to = dest / path.name
            if path.is_dir():
                shutil.copytree(path, to, ignore=lambda d, names: [
                    n for n in names if _ignored((Path(d) / n).relative_to(REPO), patterns)])
            else:
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, to)


def test_dockerfile_is_multi_stage_non_root_and_runs_only_the_script() -> None:
    ins = _instructions()
    stages = [rest.split()[-1] for _, word, rest in ins if word == "FROM"]
    assert stages == ["build", "runtime"], stages
    runs = [(stage, rest) for stage, word, rest in ins if word == "RUN"]
    assert runs
    called = []
    for stage, rest in runs:
        words = [w for w in shlex.split(rest) if not w.startswith("--mount=") and "=" not in w.split("/")[0]]
        assert len(words) == 2 and words[0].endswith("image-build.sh") and words[1] in STAGES, \
            f"RUN must call {SCRIPT} <stage>, got {rest!r}"
        called.append((stage, words[1]))
    assert [s for _, s in called] == list(STAGES), called
    runtime = [(word, rest) for stage, word, rest in ins if stage == "runtime"]
    user = [rest for word, rest in runtime if word == "USER"]
    assert user and all(part.isdigit() and int(part) != 0 for part in user[-1].split(":")), user
    assert ("ENTRYPOINT", '["kthena-router"]') in runtime


@pytest.mark.timeout(1500)  # a cold cargo cache compiles every crate (about 1.5 min alone on 2 idle cores)
def test_script_builds_installs_and_verifies_a_working_router(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _copy_build_context(src)
    assert not list(src.rglob("*.so")), "a prebuilt extension leaked into the build context"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=sys.executable, DIST=str(tmp_path / "dist"), BUILD_VENV=str(tmp_path / "build-venv"),
               PREFIX=str(tmp_path / "prefix"), CARGO_TARGET_DIR=str(REPO / "target" / "image"),
               TMPDIR=str(tmp_path))
    for stage in STAGES:
        proc = subprocess.run(["bash", str(src / SCRIPT), stage], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=1500)
        assert proc.returncode == 0, f"stage {stage} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    wheels = list((tmp_path / "dist").glob("kthena_router-*.whl"))
    assert len(wheels) == 1, wheels
    prefix = tmp_path / "prefix"
    site = next(prefix.glob("lib/python3*/site-packages"))
    assert list((site / "kthena_router").glob("_core*.so")), "the wheel carries no Rust extension"
    assert (site / "controller").is_dir()

    # the installed console script serves traffic: nothing is imported from the checkout
    sim = harness.start_simulator(tmp_path / "logs", engines=2, fast=True)
    try:
        config = harness.write_config(tmp_path / "routes.yaml", harness.engine_config(sim.ports))
        port, admin_port = harness.free_ports(2)
        argv = harness.router_argv(config, port, admin_port, 1, tmp_path / "runtime")
        assert argv[1:3] == ["-m", "kthena_router.cli"]
        proc = harness.ManagedProcess("installed-router", [str(prefix / "bin" / "kthena-router"), *argv[3:]],
                                      tmp_path / "logs", env={"PYTHONPATH": ""}, cwd=tmp_path)
        router = harness.Router(proc, port, admin_port, config, tmp_path / "runtime", 1)
        try:
            router.wait_ready()
            reply = router.openai().chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
            assert reply.choices[0].message.content
            debug = router.admin_get("/debug/workers").json()
            assert debug["workers"], debug
        finally:
            router.stop()
    finally:
        sim.stop()


@pytest.mark.parametrize("stage", ["", "bogus"])
def test_script_refuses_unknown_stages(stage: str) -> None:
    proc = subprocess.run(["bash", str(REPO / SCRIPT), *([stage] if stage else [])], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr
