"""Real-process fixtures shared by every integration test: simulator, router, configs.

Everything listens on 127.0.0.1 on free ports picked at run time. Each process runs in
its own session (process group), its stdout/stderr go to files (tails are attached to a
failing test's report by tests/conftest.py), and every process is killed at teardown
and, as a last resort, at interpreter exit. Waits poll with generous deadlines: the
machine is small and shared.

Import as `import harness` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtest.ports import free_ports  # n distinct loopback ports, none handed out twice

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
HOST = "127.0.0.1"
READY_TIMEOUT_S = 90.0  # generous: 2 busy cores, spawned workers import everything
STOP_TIMEOUT_S = 30.0

ROUTE_API = "networking.serving.volcano.sh/v1alpha1"
ENDPOINTS_API = "router.kthena.io/v1alpha1"


# --- ports ---------------------------------------------------------------------------


def free_port() -> int:
    return free_ports(1)[0]


def port_accepts(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(predicate: Any, timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll predicate() until truthy; returns its value or raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def metrics_when(router: "Router", predicate: Any, timeout: float = 10.0) -> Any:
    """The router's parsed metrics once predicate(families) holds, else the last scrape (the
    caller's assertions then show what was there). The Rust front end reports a request
    to Python just after the client has the reply (docs/rust-front.md), so counters of a
    request that just ended are eventually, not immediately, there."""
    deadline = time.monotonic() + timeout
    while True:
        fams = parse_metrics(router.metrics_text())
        if predicate(fams) or time.monotonic() >= deadline:
            return fams
        time.sleep(0.05)


# --- processes -------------------------------------------------------------------------

_LIVE: list["ManagedProcess"] = []
ALL_PROCESSES: list["ManagedProcess"] = []  # for failure reports (conftest)


class ManagedProcess:
    """A child process in its own process group, output captured to files."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.argv = list(argv)
        stem = f"{name}-{int(time.time() * 1000) % 10_000_000}"
        self.stdout_path = log_dir / f"{stem}.out"
        self.stderr_path = log_dir / f"{stem}.err"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the router sets its own
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=full_env,
                cwd=str(cwd), start_new_session=True,
            )
        self.pid = self.proc.pid
        self.started_at = time.time()
        self.stopped_at: float | None = None
        _LIVE.append(self)
        ALL_PROCESSES.append(self)

    # -- state
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def tail(self, lines: int = 60) -> str:
        out = []
        for label, text in (("stdout", self.stdout()), ("stderr", self.stderr())):
            body = "\n".join(text.splitlines()[-lines:])
            out.append(f"--- {self.name} (pid {self.pid}) {label} ---\n{body}")
        return "\n".join(out)

    # -- control
    def send_signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Send sig, wait up to timeout, then SIGKILL the whole process group."""
        if self.alive():
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()
        return self.proc.returncode

    def kill_group(self) -> None:
        """SIGKILL our process group (children such as granian workers included)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.stopped_at is None:
            self.stopped_at = time.time()
        if self in _LIVE:
            _LIVE.remove(self)


@atexit.register
def _kill_leftovers() -> None:
    for p in list(_LIVE):
        p.kill_group()


# --- simulator -------------------------------------------------------------------------


class Simulator:
    def __init__(self, process: ManagedProcess, ports: list[int], admin_port: int) -> None:
        self.process = process
        self.ports = ports
        self.admin_port = admin_port
        self.admin_url = f"http://{HOST}:{admin_port}"
        self.urls = [f"http://{HOST}:{p}" for p in ports]
        self._http = httpx.Client(timeout=30.0)

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        r = self._http.request(method, f"{self.admin_url}{path}", json=body)
        r.raise_for_status()
        return r.json() if r.content else None

    def engines(self) -> list[dict[str, Any]]:
        return self._admin("GET", "/admin/engines")

    def set_faults(self, engine: int, **faults: Any) -> dict[str, Any]:
        return self._admin("POST", f"/admin/engines/{engine}/faults", faults)

    def get_faults(self, engine: int) -> dict[str, Any]:
        return self._admin("GET", f"/admin/engines/{engine}/faults")

    def reset_faults(self, engine: int | None = None) -> None:
        for i in self._indices(engine):
            self._admin("POST", f"/admin/engines/{i}/faults/reset")

    def requests(self, engine: int) -> dict[str, Any]:
        return self._admin("GET", f"/admin/engines/{engine}/requests")

    def reset_requests(self, engine: int | None = None) -> None:
        for i in self._indices(engine):
            self._admin("POST", f"/admin/engines/{i}/requests/reset")

    def state(self, engine: int) -> dict[str, Any]:
        return self._admin("GET", f"/admin/engines/{engine}/state")

    def received(self) -> list[int]:
        """Requests received per engine since the last reset."""
        return [self.requests(i)["received"] for i in range(len(self.ports))]

    def _indices(self, engine: int | None) -> Iterable[int]:
        return range(len(self.ports)) if engine is None else (engine,)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        self._http.close()
        return self.process.stop(sig)

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulator(log_dir: Path, engines: int = 3, *, flavour: str = "vllm", model: str = "demo",
                    lora: Sequence[str] = (), fast: bool = False, extra_args: Sequence[str] = (),
                    timeout: float = READY_TIMEOUT_S) -> Simulator:
    """Start `python -m loadtest.simulator` and wait for its JSON ready line."""
    *ports, admin_port = free_ports(engines + 1)
    argv = [PYTHON, "-m", "loadtest.simulator", "--engines", str(engines), "--host", HOST,
            "--ports", ",".join(map(str, ports)), "--admin-port", str(admin_port),
            "--model", model, "--flavour", flavour]
    for name in lora:
        argv += ["--lora", name]
    if fast:
        argv.append("--fast")
    argv += list(extra_args)
    proc = ManagedProcess("simulator", argv, log_dir)

    def ready() -> dict[str, Any] | None:
        if not proc.alive():
            raise RuntimeError(f"simulator exited with {proc.returncode}\n{proc.tail()}")
        for line in proc.stdout().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("ready"):
                    return msg
        return None

    try:
        msg = wait_until(ready, timeout, what="simulator ready line")
    except BaseException:
        proc.kill_group()
        raise
    return Simulator(proc, list(msg.get("ports", ports)), int(msg.get("admin_port", admin_port)))


# --- router --------------------------------------------------------------------------


class Router:
    def __init__(self, process: ManagedProcess, port: int, admin_port: int, config_path: Path,
                 runtime_dir: Path, workers: int) -> None:
        self.process = process
        self.port = port
        self.admin_port = admin_port
        self.config_path = config_path
        self.runtime_dir = runtime_dir
        self.workers = workers
        self.base_url = f"http://{HOST}:{port}"
        self.openai_url = f"{self.base_url}/v1"
        self.admin_url = f"http://{HOST}:{admin_port}"
        self._http = httpx.Client(timeout=30.0)

    # -- admin
    def admin_get(self, path: str) -> httpx.Response:
        return self._http.get(f"{self.admin_url}{path}")

    def readyz(self) -> httpx.Response:
        return self.admin_get("/readyz")

    def metrics_text(self) -> str:
        r = self.admin_get("/metrics")
        r.raise_for_status()
        return r.text

    def reload(self, timeout_s: float = 30.0) -> httpx.Response:
        return self._http.post(f"{self.admin_url}/admin/reload", params={"timeout": timeout_s},
                               timeout=timeout_s + 30)

    def worker_pids(self) -> list[int]:
        r = self.admin_get("/debug/workers")
        r.raise_for_status()
        return [w["pid"] for w in r.json()["workers"]]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        last = [""]

        def ready() -> bool:
            if not self.process.alive():
                raise RuntimeError(f"router exited with {self.process.returncode}\n{self.process.tail()}")
            try:
                r = self.readyz()
            except httpx.HTTPError as exc:
                last[0] = repr(exc)
                return False
            last[0] = r.text
            # /readyz reports the workers' loaded config; under load the first connection
            # right after it was once refused, so the client port must accept as well
            return r.status_code == 200 and port_accepts(self.port)

        try:
            wait_until(ready, timeout, interval=0.1, what="router /readyz")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last answer: {last[0]}\n{self.process.tail()}") from None

    def openai(self, **kwargs: Any) -> Any:
        """An openai.OpenAI client for this router (no SDK retries unless asked)."""
        import openai

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        return openai.OpenAI(base_url=self.openai_url, api_key="test-key", **kwargs)

    def async_openai(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        return openai.AsyncOpenAI(base_url=self.openai_url, api_key="test-key", **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        self._http.close()
        return self.process.stop(sig, timeout)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def router_argv(config_path: Path, port: int, admin_port: int, workers: int, runtime_dir: Path,
                *, drain_grace_s: float = 10.0, log_level: str = "info",
                extra_args: Sequence[str] = ()) -> list[str]:
    return [PYTHON, "-m", "kthena_router.cli", "--config", str(config_path), "--host", HOST,
            "--port", str(port), "--admin-host", HOST, "--admin-port", str(admin_port),
            "--workers", str(workers), "--drain-grace-s", str(drain_grace_s),
            "--log-level", log_level, "--runtime-dir", str(runtime_dir), *extra_args]


def start_router(config_path: Path, log_dir: Path, *, workers: int = 1, drain_grace_s: float = 10.0,
                 log_level: str = "info", extra_args: Sequence[str] = (), wait: bool = True,
                 timeout: float = READY_TIMEOUT_S) -> Router:
    """Start `python -m kthena_router.cli` on free ports; wait for /readyz unless wait=False."""
    port, admin_port = free_ports(2)
    runtime_dir = log_dir / f"router-runtime-{port}"
    argv = router_argv(Path(config_path), port, admin_port, workers, runtime_dir,
                       drain_grace_s=drain_grace_s, log_level=log_level, extra_args=extra_args)
    proc = ManagedProcess("router", argv, log_dir)
    router = Router(proc, port, admin_port, Path(config_path), runtime_dir, workers)
    if wait:
        try:
            router.wait_ready(timeout)
        except BaseException:
            proc.kill_group()
            raise
    return router


@contextlib.contextmanager
def script_engine(name: str, script: str, log_dir: Path) -> Iterator[int]:
    """A tiny engine written as a Python script (argv[1] = port) on a free port, for tests
    that need engine behaviour the simulator does not have; yields the port."""
    port = free_port()
    proc = ManagedProcess(name, [PYTHON, "-c", script, str(port)], log_dir)
    try:
        wait_until(lambda: port_accepts(port), 60, what=name)
        yield port
    finally:
        proc.kill_group()


# --- configs -------------------------------------------------------------------------


def route_doc(name: str, model_name: str | None, targets: Sequence[tuple[str, int | None]] | str, *,
              lora: Sequence[str] = (), rules: list[dict[str, Any]] | None = None,
              namespace: str | None = None) -> dict[str, Any]:
    """A ModelRoute. targets: a server name, or [(server, weight|None), ...] for one rule."""
    if rules is None:
        if isinstance(targets, str):
            targets = [(targets, None)]
        tms = [{"modelServerName": s, **({"weight": w} if w is not None else {})} for s, w in targets]
        rules = [{"name": "default", "targetModels": tms}]
    spec: dict[str, Any] = {"rules": rules}
    if model_name is not None:
        spec["modelName"] = model_name
    if lora:
        spec["loraAdapters"] = list(lora)
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": ROUTE_API, "kind": "ModelRoute", "metadata": meta, "spec": spec}


def server_doc(name: str, model: str, labels: dict[str, str], *, engine: str = "vLLM", port: int = 8000,
               timeout: str | None = None, retry_attempts: int | None = None,
               retry_interval: str | None = None, annotations: dict[str, str] | None = None,
               namespace: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": model,
        "inferenceEngine": engine,
        "workloadSelector": {"matchLabels": dict(labels)},
        "workloadPort": {"port": port, "protocol": "http"},
    }
    policy: dict[str, Any] = {}
    if timeout is not None:
        policy["timeout"] = timeout
    if retry_attempts is not None or retry_interval is not None:
        policy["retry"] = {k: v for k, v in (("attempts", retry_attempts), ("retryInterval", retry_interval))
                           if v is not None}
    if policy:
        spec["trafficPolicy"] = policy
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": ROUTE_API, "kind": "ModelServer", "metadata": meta, "spec": spec}


def endpoints_doc(name: str, ports: Sequence[int], labels: dict[str, str], *, address: str = HOST,
                  namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": ENDPOINTS_API,
        "kind": "Endpoints",
        "metadata": meta,
        "spec": {"endpoints": [{"address": address, "port": p, "labels": dict(labels)} for p in ports]},
    }


def engine_config(ports: Sequence[int], *, model: str = "demo", server: str = "demo",
                  lora: Sequence[str] = (), timeout: str | None = None, retry_attempts: int | None = None,
                  retry_interval: str | None = None, engine: str = "vLLM") -> list[dict[str, Any]]:
    """The usual config: route `model` (+ LoRA adapters) -> one ModelServer over `ports`."""
    labels = {"app": server}
    docs = [route_doc(server, model, server)]
    if lora:
        docs.append(route_doc(f"{server}-lora", None, server, lora=lora))
    docs.append(server_doc(server, model, labels, engine=engine, timeout=timeout,
                           retry_attempts=retry_attempts, retry_interval=retry_interval))
    docs.append(endpoints_doc(f"{server}-engines", ports, labels))
    return docs


def write_config(path: Path, docs: Sequence[dict[str, Any]] | str) -> Path:
    """Write YAML documents (or raw text) atomically (rename), as editors do."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = docs if isinstance(docs, str) else yaml.safe_dump_all(list(docs), sort_keys=False)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


# --- metrics -------------------------------------------------------------------------


def stream_with_dying_engines(router: "Router", simulator: "Simulator", body: dict[str, Any],
                              after_tokens: int = 2) -> list[str]:
    """Every engine dies after `after_tokens` streamed tokens; the `data:` lines the client got."""
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, die_after_tokens=after_tokens)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions", json=body) as resp:
            assert resp.status_code == 200  # headers went out before the engine died
            return [line for line in resp.iter_lines() if line.startswith("data: ")]


def parse_metrics(text: str) -> dict[str, Any]:
    """{family name: Metric} parsed with prometheus_client's parser (raises on bad text)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {fam.name: fam for fam in text_string_to_metric_families(text)}


def metric_value(families: dict[str, Any], sample_name: str, **labels: str) -> float:
    """Sum of the samples named sample_name whose labels include `labels` (0 if none)."""
    total = 0.0
    for fam in families.values():
        for s in fam.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def chat_ok(router: Router, http: Any, model: str = "demo") -> None:
    """One small chat completion through the router succeeds with content (a liveness probe
    for suites that throw bad input at it)."""
    r = http.post(f"{router.openai_url}/chat/completions",
                  json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["message"]["content"]


def engine_total(sim: Simulator) -> int:
    """Requests the simulator's engines have received so far."""
    return sum(sim.received())
