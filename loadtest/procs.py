"""Processes of the overhead benchmark: the simulator, our router, peer routers.

Each runs in its own session with its output in files, and is stopped by its own id.
Also CPU accounting per process tree (from /proc), and the TCP_NODELAY preload shim
(nodelay_shim.c) compiled on demand for peers that leave Nagle's algorithm on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtest.loadgen import chat_body
from loadtest.ports import free_ports

HOST = "127.0.0.1"
CHAT_PATH = "/v1/chat/completions"
# urllib would honour *_proxy variables; everything here is loopback.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_CLK_TCK = os.sysconf("SC_CLK_TCK")
SHIM_SOURCE = Path(__file__).with_name("nodelay_shim.c")


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _HTTP.open(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ------------------------------------------------------------------- CPU of a process tree


def _proc_stats() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime+cutime+cstime in ticks) for every visible process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = raw[raw.rfind(b")") + 2 :].split()  # comm may hold spaces and parens
        # fields[0] is field 3 (state): ppid = 4, utime..cstime = 14..17
        out[int(d)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    return out


def tree_cpu_s(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each root's whole process tree.

    Includes cutime/cstime so that a descendant that exited and was reaped during the
    window still counts (its time moves into its parent's cutime).
    """
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    res = {}
    for name, root in roots.items():
        total, stack = 0, [root]
        while stack:
            pid = stack.pop()
            if pid in stats:
                total += stats[pid][1]
                stack.extend(children.get(pid, ()))
        res[name] = total / _CLK_TCK
    return res


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return (sum(vals[:8]) - idle) / _CLK_TCK


def tree_size(root: int) -> int:
    stats = _proc_stats()
    n, stack = 0, [root]
    while stack:
        pid = stack.pop()
        n += 1
        stack.extend(p for p, (pp, _) in stats.items() if pp == pid)
    return n


# ----------------------------------------------------------------------------- processes


class Proc:
    """A child process in its own session, logs to files, stopped by its own id."""

    def __init__(self, name: str, cmd: list[str], logdir: Path, env: dict | None = None):
        self.name = name
        self.cmd = cmd
        self.out_path = logdir / f"{name}.out"
        self.err_path = logdir / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.popen = subprocess.Popen(
            cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The group holds this process and its workers only (start_new_session above).
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._out.close()
        self._err.close()

    def tail(self, n: int = 30) -> str:
        parts = []
        for p in (self.out_path, self.err_path):
            try:
                lines = p.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                continue
            if lines:
                parts.append(f"--- {p.name}\n" + "\n".join(lines))
        return "\n".join(parts)


class StartError(RuntimeError):
    pass


def wait_until(pred: Callable[[], bool], proc: Proc, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise StartError(f"{proc.name} exited ({proc.popen.returncode}) before {what}\n{proc.tail()}")
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise StartError(f"{proc.name}: no {what} after {timeout_s:.0f}s\n{proc.tail()}")


def probe_chat(url: str, model: str, headers: dict[str, str] | None = None) -> bool:
    status, data = http("POST", url + CHAT_PATH, chat_body(model, max_tokens=2), timeout=5, headers=headers)
    return status == 200 and b"[DONE]" in data


def start_simulator(engines: int, model: str, sim_args: str, logdir: Path, procs: list[Proc],
                    timeout_s: float) -> tuple[Proc, list[int], int]:
    *ports, admin = free_ports(engines + 1)
    cmd = [
        sys.executable, "-m", "loadtest.simulator", "--engines", str(engines), "--fast",
        "--host", HOST, "--ports", ",".join(map(str, ports)), "--admin-port", str(admin),
        "--model", model, *shlex.split(sim_args),
    ]
    p = Proc("simulator", cmd, logdir)
    procs.append(p)

    def ready() -> bool:
        for line in p.out_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("ready"):
                return True
        return False

    wait_until(ready, p, timeout_s, "ready line")
    return p, ports, admin


def router_config(model: str, engine_ports: list[int], pd_roles: Sequence[str] | None = None,
                  kv_connector: str = "nixl") -> str:
    """One route, one ModelServer and file-mode Endpoints for `engine_ports`. With `pd_roles`
    (one per port: prefill | decode) the server is a PD pair group `g1` over `kv_connector`."""
    selector = "    matchLabels: {app: bench}\n"
    if pd_roles is None:
        labels = ["{app: bench}"] * len(engine_ports)
    else:
        selector += ("    pdGroup: {groupKey: group, prefillLabels: {role: prefill}, decodeLabels: {role: decode}}\n"
                     f"  kvConnector: {{type: {kv_connector}}}\n")
        labels = [f"{{app: bench, group: g1, role: {role}}}" for role in pd_roles]
    eps = "\n".join(f"  - {{address: {HOST}, port: {port}, labels: {lab}}}"
                    for port, lab in zip(engine_ports, labels))
    return f"""\
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: bench, namespace: default}}
spec:
  modelName: {model}
  rules:
  - name: all
    targetModels:
    - modelServerName: bench
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: bench, namespace: default}}
spec:
  model: {model}
  inferenceEngine: vLLM
  workloadSelector:
{selector}  workloadPort: {{port: {engine_ports[0]}, protocol: http}}
---
apiVersion: router.kthena.io/v1alpha1
kind: Endpoints
metadata: {{name: bench-engines, namespace: default}}
spec:
  endpoints:
{eps}
"""


def start_router(name: str, model: str, workers: int, router_args: str, logdir: Path,
                 engine_ports: list[int], procs: list[Proc], timeout_s: float,
                 headers: dict[str, str] | None = None, tree: str | None = None) -> tuple[Proc, str]:
    """Our router (`python -m kthena_router.cli`) with extra CLI arguments; `tree`: run
    the code of another source tree (its directory goes first on PYTHONPATH; run from a
    directory without a kthena_router package, or the current one wins)."""
    port, admin = free_ports(2)
    cfg = logdir / f"{name}.yaml"
    cfg.write_text(router_config(model, engine_ports))
    cmd = [
        sys.executable, "-m", "kthena_router.cli", "--config", str(cfg), "--host", HOST,
        "--port", str(port), "--admin-host", HOST, "--admin-port", str(admin),
        "--workers", str(workers), "--log-level", "warning", *shlex.split(router_args),
    ]
    p = Proc(name, cmd, logdir, env={"PYTHONPATH": tree} if tree else None)
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: http("GET", f"http://{HOST}:{admin}/readyz")[0] == 200, p, timeout_s, "/readyz 200")
    wait_until(lambda: probe_chat(url, model, headers), p, timeout_s, "successful chat request")
    return p, url


_PEER_ENV = {  # nothing may leave the machine (sglang-router fetches tokenizers otherwise)
    "HF_HUB_OFFLINE": "1",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


def peer_available(name: str) -> str | None:
    """None when usable, else why not."""
    if name == "sglang":
        return None if importlib.util.find_spec("sglang_router") else "sglang-router not installed"
    exe = Path(sys.executable).parent / "vllm-router"
    return None if exe.exists() or shutil.which("vllm-router") else "vllm-router not installed"


def nodelay_shim(cache_dir: Path | None = None) -> Path:
    """The compiled TCP_NODELAY shim (built with `cc` once per source version)."""
    src = SHIM_SOURCE.read_bytes()
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kthena-bench"
    out = cache / f"nodelay-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cc = os.environ.get("CC", "cc")
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise StartError(f"cannot build {SHIM_SOURCE.name} with {cc}: {res.stderr.strip()}")
        tmp.replace(out)
    return out


def start_peer(name: str, policy: str, model: str, logdir: Path, engine_ports: list[int], procs: list[Proc],
               timeout_s: float, preload: Path | None = None) -> tuple[Proc, str]:
    """sglang-router or vllm-router in front of the same engines (LD_PRELOAD `preload` if given)."""
    port, prom = free_ports(2)
    workers = [f"http://{HOST}:{p}" for p in engine_ports]
    common = [
        "--host", HOST, "--port", str(port), "--worker-urls", *workers,
        "--policy", policy, "--prometheus-port", str(prom), "--prometheus-host", HOST,
    ]
    if name == "sglang":
        cmd = [sys.executable, "-m", "sglang_router.launch_router", *common, "--log-level", "warn"]
    else:
        exe = Path(sys.executable).parent / "vllm-router"
        cmd = [
            str(exe) if exe.exists() else "vllm-router", *common, "--log-level", "warning",
            "--worker-startup-check-interval", "1",
        ]
    env = dict(_PEER_ENV)
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    p = Proc(f"{name}-router", cmd, logdir, env=env)
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: probe_chat(url, model), p, timeout_s, "successful chat request")
    return p, url


class Engines:
    """The simulator's admin API: per-engine request logs."""

    def __init__(self, admin_port: int):
        self.base = f"http://{HOST}:{admin_port}/admin/engines"
        status, data = http("GET", self.base)
        if status != 200:
            raise StartError(f"simulator admin: HTTP {status}")
        self.indexes = [e["index"] for e in json.loads(data)]

    def reset(self) -> None:
        for i in self.indexes:
            http("POST", f"{self.base}/{i}/requests/reset", b"{}")

    def chat_counts(self) -> dict[str, int]:
        """Chat requests the engines saw since reset, by final status (settles briefly)."""
        last: dict[str, int] = {}
        for _ in range(20):
            counts: dict[str, int] = {}
            for i in self.indexes:
                status, data = http("GET", f"{self.base}/{i}/requests")
                if status != 200:
                    continue
                for entry in json.loads(data).get("log", []):
                    if entry.get("path") == CHAT_PATH:
                        st = entry.get("status", "?")
                        counts[st] = counts.get(st, 0) + 1
            if counts == last:
                return counts
            last = counts
            time.sleep(0.1)
        return last
