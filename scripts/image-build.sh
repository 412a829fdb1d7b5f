#!/usr/bin/env bash
# The build steps of the router image, one stage per call. The Dockerfile's RUN lines call
# this script and nothing else, so the steps are tested without a container engine
# (tests/deploy/test_image_build.py runs wheel, install and verify in fresh venvs).
#
#   scripts/image-build.sh toolchain   C compiler + Rust (rustup, minimal profile) if absent
#   scripts/image-build.sh wheel       maturin builds the wheel (Rust extension + both packages) into $DIST
#   scripts/image-build.sh install     a venv at $PREFIX with that wheel and its dependencies
#   scripts/image-build.sh verify      the installed router starts its CLI and loads its extension
#
# Environment (defaults in brackets):
#   PYTHON [python3]                  interpreter that creates the venvs
#   DIST [dist]                       where the wheel goes (wheel) and is taken from (install)
#   BUILD_VENV [$TMPDIR/kthena-build-venv]  venv holding maturin (wheel)
#   PREFIX [/opt/kthena-router]       the runtime venv (install, verify)
#   CARGO_TARGET_DIR [target]         cargo's build directory: keep it to build incrementally
#   RUST_TOOLCHAIN [1.95.0]           installed by `toolchain` only when cargo is missing
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DIST=${DIST:-dist}
BUILD_VENV=${BUILD_VENV:-${TMPDIR:-/tmp}/kthena-build-venv}
PREFIX=${PREFIX:-/opt/kthena-router}
RUST_TOOLCHAIN=${RUST_TOOLCHAIN:-1.95.0}
MATURIN_SPEC='maturin>=1.7,<2'   # as pyproject.toml's build-system
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

log() { printf 'image-build: %s\n' "$*" >&2; }

stage_toolchain() {
    if command -v cargo >/dev/null 2>&1 && command -v cc >/dev/null 2>&1; then
        log "toolchain present: $(cargo --version), $(cc --version | head -n1)"
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        log "cargo or cc missing and not root: install a Rust toolchain and a C compiler first"
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends build-essential curl ca-certificates >/dev/null
    rm -rf /var/lib/apt/lists/*
    # rustup's installer, minimal profile, pinned toolchain (CARGO_HOME/RUSTUP_HOME from the env)
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --no-modify-path --profile minimal --default-toolchain "$RUST_TOOLCHAIN"
    log "installed $("${CARGO_HOME:-$HOME/.cargo}/bin/cargo" --version)"
}

stage_wheel() {
    if [ ! -x "$BUILD_VENV/bin/maturin" ]; then
        "$PYTHON" -m venv "$BUILD_VENV"
        "$BUILD_VENV/bin/pip" install -q --disable-pip-version-check "$MATURIN_SPEC"
    fi
    mkdir -p "$DIST"
    rm -f "$DIST"/kthena_router-*.whl
    # --release with pyproject's [tool.maturin] (features, python-packages); --compatibility
    # linux: the image's own glibc, no manylinux audit needed for a wheel that never leaves it
    "$BUILD_VENV/bin/maturin" build --release --compatibility linux --out "$DIST" --quiet
    ls "$DIST"/kthena_router-*.whl >&2
}

stage_install() {
    local wheel
    wheel=$(ls "$DIST"/kthena_router-*.whl 2>/dev/null | head -n1)
    if [ -z "$wheel" ]; then
        log "no wheel in $DIST: run the wheel stage first"
        exit 1
    fi
    "$PYTHON" -m venv "$PREFIX"
    # bytecode is compiled now: the container's root filesystem is read-only at run time
    "$PREFIX/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$wheel"
    log "installed $(basename "$wheel") into $PREFIX"
}

stage_verify() {
    # run outside the source tree, with no PYTHONPATH, so only the installed packages can load
    (cd / && env -u PYTHONPATH "$PREFIX/bin/kthena-router" --help >/dev/null)
    (cd / && env -u PYTHONPATH "$PREFIX/bin/python" -c '
import pathlib, kthena_router, kthena_router._core as core, controller
assert "site-packages" in kthena_router.__file__, kthena_router.__file__
print("image-build: verify ok:", pathlib.Path(core.__file__).name)' >&2)
}

case "${1:-}" in
    toolchain) stage_toolchain ;;
    wheel) stage_wheel ;;
    install) stage_install ;;
    verify) stage_verify ;;
    *) echo "usage: $0 toolchain|wheel|install|verify" >&2; exit 2 ;;
esac
