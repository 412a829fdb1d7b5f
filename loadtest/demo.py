"""`make run`: 3 simulated vLLM engines + the router on 127.0.0.1:8080, until Ctrl-C.

Starts `python -m loadtest.simulator` and `python -m kthena_router.cli` as child
processes (each in its own session, so that Ctrl-C reaches only this launcher, which
then stops the router first, letting it drain, and then the simulator), waits until
both are ready, and prints ready-to-paste curl lines. Exit status: 0 after a clean stop,
1 if a port is taken or a child fails. Imports nothing from kthena_router.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
DEFAULT_CONFIG = REPO / "configs" / "demo.yaml"
DEFAULT_ENGINE_PORTS = (8001, 8002, 8003)
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class DemoError(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.demo", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=8080, help="router port")
    p.add_argument("--admin-port", type=int, default=15000, help="router admin port")
    p.add_argument("--engine-ports", default=",".join(map(str, DEFAULT_ENGINE_PORTS)),
                   help="comma-separated ports of the simulated engines")
    p.add_argument("--sim-admin-port", type=int, default=8100, help="simulator admin port")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="router config file")
    p.add_argument("--workers", type=int, default=1, help="router worker processes")
    p.add_argument("--drain-grace-s", type=float, default=5.0, help="router drain grace on stop")
    return p.parse_args(argv)


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def check_ports(named: dict[str, int]) -> None:
    taken = [f"{what} port {port}" for what, port in named.items() if port_taken(port)]
    if taken:
        raise DemoError(
            f"{', '.join(taken)} on {HOST} already in use: stop what is using it "
            "(an earlier demo still running?) or choose other ports (see --help)"
        )


def demo_config(config: Path, engine_ports: list[int], workdir: Path) -> Path:
    """The config, with the Endpoints ports replaced when the engines run elsewhere."""
    if tuple(engine_ports) == DEFAULT_ENGINE_PORTS:
        return config
    docs = list(yaml.safe_load_all(config.read_text()))
    ports = iter(engine_ports)
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Endpoints":
            for ep in doc.get("spec", {}).get("endpoints", []):
                ep["port"] = next(ports)
    out = workdir / "demo.yaml"
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


class Child:
    def __init__(self, name: str, argv: list[str], *, capture_stdout: bool = False) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv, cwd=str(REPO), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture_stdout else None, text=capture_stdout,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float) -> None:
        """SIGTERM, wait, then SIGKILL the child's process group (workers included)."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"demo: {self.name} did not stop in {timeout:.0f}s, killing it", file=sys.stderr)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def wait_simulator_ready(sim: Child, stop: threading.Event) -> dict:
    """Read the simulator's stdout until its JSON ready line; then keep forwarding it."""
    assert sim.proc.stdout is not None
    found: list[dict] = []
    got = threading.Event()

    def pump() -> None:
        for line in sim.proc.stdout:  # type: ignore[union-attr]
            if not got.is_set() and line.lstrip().startswith("{"):
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = {}
                if msg.get("ready"):
                    found.append(msg)
                    got.set()
                    continue
            sys.stdout.write(line)
        got.set()  # EOF: the simulator is gone

    threading.Thread(target=pump, name="sim-stdout", daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not got.wait(0.2):
        if stop.is_set():
            raise KeyboardInterrupt
        if time.monotonic() > deadline:
            raise DemoError(f"the simulator was not ready after {READY_TIMEOUT_S:.0f}s")
    if not found:
        raise DemoError(f"the simulator exited (status {sim.proc.wait()}) before it was ready")
    return found[0]


def wait_router_ready(router: Child, admin_port: int, stop: threading.Event) -> None:
    url = f"http://{HOST}:{admin_port}/readyz"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if stop.is_set():
            raise KeyboardInterrupt
        if not router.alive():
            raise DemoError(f"the router exited with status {router.proc.returncode} (see its messages above)")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise DemoError(f"the router was not ready after {READY_TIMEOUT_S:.0f}s ({url})")
        time.sleep(0.2)


def banner(port: int, admin_port: int, config: Path) -> str:
    base = f"http://{HOST}:{port}"
    admin = f"http://{HOST}:{admin_port}"
    chat = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    stream = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "Tell me a story"}],
                         "max_tokens": 64, "stream": True})
    return f"""
kthena-router demo is up: router {base} -> 3 simulated vLLM engines (model "demo").

Chat completion:
  curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{chat}'

Streaming:
  curl -sN {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{stream}'

Models:   curl -s {base}/v1/models
Metrics:  curl -s {admin}/metrics
Reload:   edit {config} (reloaded on save), or curl -s -X POST {admin}/admin/reload

Press Ctrl-C to stop.
"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine_ports = [int(p) for p in args.engine_ports.split(",") if p.strip()]
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    children: list[Child] = []
    code = 0
    with tempfile.TemporaryDirectory(prefix="kthena-demo-") as tmp:
        try:
            ports = {"router": args.port, "router admin": args.admin_port, "simulator admin": args.sim_admin_port}
            ports.update({f"engine {i + 1}": p for i, p in enumerate(engine_ports)})
            check_ports(ports)
            config = demo_config(Path(args.config), engine_ports, Path(tmp))
            print(f"demo: starting {len(engine_ports)} simulated engines on ports "
                  f"{', '.join(map(str, engine_ports))} ...", flush=True)
            sim = Child("simulator", [
                sys.executable, "-m", "loadtest.simulator", "--engines", str(len(engine_ports)),
                "--host", HOST, "--ports", ",".join(map(str, engine_ports)),
                "--admin-port", str(args.sim_admin_port), "--model", "demo",
                "--lora", "demo-lora-a", "--lora", "demo-lora-b",
            ], capture_stdout=True)
            children.append(sim)
            wait_simulator_ready(sim, stop)
            print(f"demo: starting the router on {HOST}:{args.port} (admin port {args.admin_port}) ...", flush=True)
            router = Child("router", [
                sys.executable, "-m", "kthena_router.cli", "--config", str(config),
                "--host", HOST, "--port", str(args.port), "--admin-host", HOST,
                "--admin-port", str(args.admin_port), "--workers", str(args.workers),
                "--drain-grace-s", str(args.drain_grace_s),
            ])
            children.insert(0, router)  # stopped first: it drains while the engines still answer
            wait_router_ready(router, args.admin_port, stop)
            print(banner(args.port, args.admin_port, Path(args.config)), flush=True)
            while not stop.wait(0.5):
                dead = [c for c in children if not c.alive()]
                if dead:
                    raise DemoError(f"the {dead[0].name} exited unexpectedly "
                                    f"(status {dead[0].proc.returncode}); stopping")
        except KeyboardInterrupt:
            pass
        except DemoError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            code = 1
        finally:
            if children:
                print("\ndemo: stopping ...", flush=True)
            for child in children:
                child.stop(args.drain_grace_s + STOP_TIMEOUT_S if child.name == "router" else STOP_TIMEOUT_S)
    if code == 0:
        print("demo: stopped.", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
