"""Router overhead benchmark: the same closed-loop load sent directly to the engines and
through the router (and optionally through sglang-router / vllm-router).

Starts a fast-mode simulator (3 engines) and the router on free loopback ports, then for
each repeat x concurrency x target runs a warm-up phase and a measured phase of streamed
chat requests (16 tokens). Reports req/s, latency and TTFT percentiles, the latency the
router adds, the throughput ratio router/direct, and CPU-ms per request of each process
tree (router = parent + granian workers). Medians over repeats.

    python -m loadtest.bench_overhead [--workers 1] [--concurrency 1,64] [--requests 4000]
        [--repeats 3] [--peer sglang|vllm|all] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from loadtest.loadgen import LoadGen, chat_body, install_uvloop, summarize

HOST = "127.0.0.1"
CHAT_PATH = "/v1/chat/completions"
# urllib would honour *_proxy variables; everything here is loopback.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- helpers


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
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


def wait_until(pred, proc: Proc, timeout_s: float, what: str) -> None:
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


def start_simulator(a, logdir: Path, procs: list[Proc]) -> tuple[Proc, list[int], int]:
    *ports, admin = free_ports(a.engines + 1)
    cmd = [
        sys.executable, "-m", "loadtest.simulator", "--engines", str(a.engines), "--fast",
        "--host", HOST, "--ports", ",".join(map(str, ports)), "--admin-port", str(admin),
        "--model", a.model, *shlex.split(a.sim_args),
    ]
    p = Proc("simulator", cmd, logdir)
    procs.append(p)

    def ready() -> bool:
        for line in p.out_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("ready"):
                return True
        return False

    wait_until(ready, p, a.start_timeout, "ready line")
    return p, ports, admin


def router_config(model: str, engine_ports: list[int]) -> str:
    eps = "\n".join(
        f"  - {{address: {HOST}, port: {port}, labels: {{app: bench}}}}" for port in engine_ports
    )
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
    matchLabels: {{app: bench}}
  workloadPort: {{port: {engine_ports[0]}, protocol: http}}
---
apiVersion: router.kthena.io/v1alpha1
kind: Endpoints
metadata: {{name: bench-engines, namespace: default}}
spec:
  endpoints:
{eps}
"""


def probe_chat(url: str, model: str) -> bool:
    body = chat_body(model, max_tokens=2)
    status, data = http("POST", url + CHAT_PATH, body, timeout=5)
    return status == 200 and b"[DONE]" in data


def start_router(a, logdir: Path, engine_ports: list[int], procs: list[Proc]) -> tuple[Proc, str]:
    port, admin = free_ports(2)
    cfg = logdir / "router.yaml"
    cfg.write_text(router_config(a.model, engine_ports))
    cmd = [
        sys.executable, "-m", "kthena_router.cli", "--config", str(cfg), "--host", HOST,
        "--port", str(port), "--admin-host", HOST, "--admin-port", str(admin),
        "--workers", str(a.workers), "--log-level", "warning", *shlex.split(a.router_args),
    ]
    p = Proc("router", cmd, logdir)
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: http("GET", f"http://{HOST}:{admin}/readyz")[0] == 200, p, a.start_timeout, "/readyz 200")
    wait_until(lambda: probe_chat(url, a.model), p, a.start_timeout, "successful chat request")
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
        import importlib.util

        return None if importlib.util.find_spec("sglang_router") else "sglang-router not installed"
    exe = Path(sys.executable).parent / "vllm-router"
    return None if exe.exists() or shutil.which("vllm-router") else "vllm-router not installed"


def start_peer(name: str, a, logdir: Path, engine_ports: list[int], procs: list[Proc]) -> tuple[Proc, str]:
    port, prom = free_ports(2)
    workers = [f"http://{HOST}:{p}" for p in engine_ports]
    common = [
        "--host", HOST, "--port", str(port), "--worker-urls", *workers,
        "--policy", a.peer_policy, "--prometheus-port", str(prom), "--prometheus-host", HOST,
    ]
    if name == "sglang":
        cmd = [sys.executable, "-m", "sglang_router.launch_router", *common, "--log-level", "warn"]
    else:
        exe = Path(sys.executable).parent / "vllm-router"
        cmd = [
            str(exe) if exe.exists() else "vllm-router", *common, "--log-level", "warning",
            "--worker-startup-check-interval", "1",
        ]
    p = Proc(f"{name}-router", cmd, logdir, env=_PEER_ENV)
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: probe_chat(url, a.model), p, a.start_timeout, "successful chat request")
    return p, url


# ------------------------------------------------------------------------- engine counts


class Engines:
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


# --------------------------------------------------------------------------------- cells


async def run_cell(a, target: str, urls: list[str], conc: int, roots: dict[str, int],
                   engines: Engines) -> dict:
    engines.reset()
    gen = LoadGen(urls, conc, body=chat_body(a.model, a.max_tokens), client=a.client,
                  timeout_s=a.request_timeout)
    try:
        # Enough warm-up for every worker to open its connection to every target.
        n_warm = max(a.warmup, 3 * conc * len(urls))
        warm = await asyncio.wait_for(gen.run(requests=n_warm), a.cell_timeout)
        # "ours" = this process and everything it started: the rest of the machine's busy
        # time is foreign load (builds, other tests) that skews latency and throughput.
        roots_all = {**roots, "ours": os.getpid()}
        busy0, cpu0 = busy_cpu_s(), tree_cpu_s(roots_all)
        res = await asyncio.wait_for(
            gen.run(requests=a.requests, duration_s=a.duration), a.cell_timeout
        )
        busy1, cpu1 = busy_cpu_s(), tree_cpu_s(roots_all)
    finally:
        await gen.close()
    cell = summarize(res)
    n = max(1, cell["requests"])
    cell["cpu_ms_per_req"] = {k: 1000.0 * (cpu1[k] - cpu0[k]) / n for k in roots}
    foreign = (busy1 - busy0) - (cpu1["ours"] - cpu0["ours"])
    cell["foreign_cpu_cores"] = max(0.0, foreign) / res.wall_s if res.wall_s > 0 else 0.0
    cell["cpu_ms_per_req"]["loadgen"] = cell.pop("client_cpu_ms_per_req")
    cell["warmup_requests"] = len(warm.samples)
    cell["warmup_ok"] = sum(s.ok for s in warm.samples)
    cell["engine_chat_requests"] = engines.chat_counts()
    return {"target": target, "concurrency": conc, **cell}


def _median(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def aggregate(cells: list[dict], targets: list[str], concs: list[int]) -> dict:
    out: dict = {}
    for t in targets:
        for c in concs:
            rs = [x for x in cells if x["target"] == t and x["concurrency"] == c]
            if not rs:
                continue
            agg = {
                "repeats": len(rs),
                "rps": _median([x["rps"] for x in rs]),
                "latency_ms": {k: _median([x["latency_ms"][k] for x in rs]) for k in ("p50", "p90", "p99")},
                "ttft_ms": {k: _median([x["ttft_ms"][k] for x in rs]) for k in ("p50", "p90", "p99")},
                "cpu_ms_per_req": {
                    k: _median([x["cpu_ms_per_req"][k] for x in rs]) for k in rs[0]["cpu_ms_per_req"]
                },
                "errors": sum(x["errors"] for x in rs),
                "foreign_cpu_cores_max": max(x["foreign_cpu_cores"] for x in rs),
            }
            out.setdefault(t, {})[str(c)] = agg
    return out


def compare(summary: dict, concs: list[int]) -> dict:
    """Each router against direct: added latency, throughput ratio, its CPU per request."""
    direct = summary.get("direct", {})
    out = {}
    for t, per_c in summary.items():
        if t == "direct":
            continue
        rows = {}
        for c in concs:
            r, d = per_c.get(str(c)), direct.get(str(c))
            if not r or not d:
                continue
            rows[str(c)] = {
                "added_p50_ms": r["latency_ms"]["p50"] - d["latency_ms"]["p50"],
                "added_p99_ms": r["latency_ms"]["p99"] - d["latency_ms"]["p99"],
                "added_ttft_p50_ms": r["ttft_ms"]["p50"] - d["ttft_ms"]["p50"],
                "throughput_ratio": r["rps"] / d["rps"] if d["rps"] else None,
                "cpu_ms_per_req": r["cpu_ms_per_req"].get(t),
            }
        lo, hi = str(min(concs)), str(max(concs))
        head = {
            f"added_p50_ms_at_c{lo}": rows.get(lo, {}).get("added_p50_ms"),
            f"added_p99_ms_at_c{lo}": rows.get(lo, {}).get("added_p99_ms"),
            f"throughput_ratio_at_c{hi}": rows.get(hi, {}).get("throughput_ratio"),
            f"cpu_ms_per_req_at_c{lo}": rows.get(lo, {}).get("cpu_ms_per_req"),
            f"cpu_ms_per_req_at_c{hi}": rows.get(hi, {}).get("cpu_ms_per_req"),
        }
        out[t] = {"headline": head, "by_concurrency": rows}
    return out


def goals(comparison: dict, concs: list[int]) -> dict:
    r = comparison.get("router")
    if not r or 1 not in concs:
        return {}
    head, rows = r["headline"], r["by_concurrency"]
    p50 = head.get("added_p50_ms_at_c1")
    cpu = max((v["cpu_ms_per_req"] for v in rows.values() if v["cpu_ms_per_req"] is not None), default=None)
    return {
        "added_p50_at_c1_le_1ms": None if p50 is None else p50 <= 1.0,
        "router_cpu_per_req_le_1ms": None if cpu is None else cpu <= 1.0,
        "router_cpu_ms_per_req_max_over_concurrency": cpu,
    }


# ------------------------------------------------------------------------------- output


def _f(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def table(summary: dict, comparison: dict, markdown: bool = False) -> str:
    head = ["target", "conc", "req/s", "p50 ms", "p90 ms", "p99 ms", "ttft p50", "ttft p99",
            "cpu ms/req (target)", "sim cpu ms/req", "loadgen cpu ms/req", "errors",
            "foreign cores"]
    rows = []
    for t, per_c in summary.items():
        for c, s in per_c.items():
            cpu = s["cpu_ms_per_req"]
            rows.append([
                t, c, _f(s["rps"], 0), _f(s["latency_ms"]["p50"], 3), _f(s["latency_ms"]["p90"], 3),
                _f(s["latency_ms"]["p99"], 3), _f(s["ttft_ms"]["p50"], 3), _f(s["ttft_ms"]["p99"], 3),
                _f(cpu.get(t), 3) if t != "direct" else "-", _f(cpu.get("simulator"), 3),
                _f(cpu.get("loadgen"), 3), str(s["errors"]), _f(s["foreign_cpu_cores_max"]),
            ])
    head2 = ["router", "conc", "added p50 ms", "added p99 ms", "added ttft p50 ms",
             "throughput ratio", "cpu ms/req"]
    rows2 = [
        [t, c, _f(v["added_p50_ms"], 3), _f(v["added_p99_ms"], 3), _f(v["added_ttft_p50_ms"], 3),
         _f(v["throughput_ratio"], 3), _f(v["cpu_ms_per_req"], 3)]
        for t, cmp in comparison.items() for c, v in cmp["by_concurrency"].items()
    ]
    return _render(head, rows, markdown) + "\n\n" + _render(head2, rows2, markdown)


def _render(head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:>{n}}}" for n in w)
    return "\n".join(fmt.format(*r) for r in [head, *rows])


def machine_info() -> dict:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# --------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1, help="router (granian) workers")
    p.add_argument("--concurrency", default="1,64", help="comma-separated list")
    p.add_argument("--requests", type=int, help="measured requests per cell (default 4000 "
                   "unless --duration is given; with both, the first reached ends the cell)")
    p.add_argument("--duration", type=float, help="measured seconds per cell")
    p.add_argument("--warmup", type=int, default=200, help="warm-up requests per cell (at least C)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peer", choices=["none", "sglang", "vllm", "all"], default="none")
    p.add_argument("--peer-policy", default="round_robin", help="our router is round-robin in step 1")
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--model", default="demo")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--client", choices=["raw", "aiohttp"], default="raw", help="load generator client")
    p.add_argument("--sim-args", default="", help="extra simulator arguments")
    p.add_argument("--router-args", default="", help="extra router arguments")
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--cell-timeout", type=float, default=600.0)
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument("--json", type=Path, help="write results as JSON")
    p.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    p.add_argument("--keep-logs", action="store_true", help="keep process logs (path printed)")
    a = p.parse_args(argv)
    if a.requests is None and a.duration is None:
        a.requests = 4000
    a.concs = sorted({int(x) for x in a.concurrency.split(",") if x.strip()})
    return a


async def bench(a, logdir: Path, procs: list[Proc]) -> dict:
    sim, ports, admin = start_simulator(a, logdir, procs)
    engines = Engines(admin)
    routers: dict[str, tuple[Proc, str]] = {"router": start_router(a, logdir, ports, procs)}
    skipped = {}
    for peer in {"none": [], "all": ["sglang", "vllm"]}.get(a.peer, [a.peer]):
        why = peer_available(peer)
        if why:
            print(f"skipping {peer}: {why}", file=sys.stderr)
            skipped[peer] = why
            continue
        routers[peer] = start_peer(peer, a, logdir, ports, procs)
    roots = {"simulator": sim.pid, **{name: p.pid for name, (p, _) in routers.items()}}
    direct = [f"http://{HOST}:{p}" for p in ports]
    targets = {"direct": direct, **{name: [url] for name, (_, url) in routers.items()}}
    router_procs = tree_size(routers["router"][0].pid)

    cells = []
    for rep in range(a.repeats):
        for c in a.concs:
            for t, urls in targets.items():  # interleaved, so that drift hits all targets alike
                cell = await run_cell(a, t, urls, c, roots, engines)
                cell["repeat"] = rep
                cells.append(cell)
                print(
                    f"[{rep}] {t:>8} c={c:<3} {cell['rps']:8.0f} req/s  p50 {_f(cell['latency_ms']['p50'], 3)} ms"
                    f"  p99 {_f(cell['latency_ms']['p99'], 3)} ms  cpu {_f(cell['cpu_ms_per_req'].get(t), 3)}"
                    f" ms/req  errors {cell['errors']}  foreign load {cell['foreign_cpu_cores']:.2f} cores",
                    file=sys.stderr,
                )
    summary = aggregate(cells, list(targets), a.concs)
    comparison = compare(summary, a.concs)
    return {
        "meta": {
            "machine": machine_info(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "router_process_tree_size": router_procs,
            "skipped_peers": skipped,
            "loadgen_client": a.client,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "cells": cells,
        "summary": summary,
        "comparison": comparison,
        "goals": goals(comparison, a.concs),
    }


def _raise_interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    install_uvloop()
    logdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    procs: list[Proc] = []
    # SIGTERM takes the same clean-up path as Ctrl-C.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    ok = False
    try:
        result = asyncio.run(bench(a, logdir, procs))
        ok = True
    except StartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        for p in reversed(procs):
            p.stop()
        if a.keep_logs or not ok:
            print(f"logs: {logdir}", file=sys.stderr)
        else:
            shutil.rmtree(logdir, ignore_errors=True)

    text = table(result["summary"], result["comparison"])
    print(text)
    foreign = max((c["foreign_cpu_cores"] for c in result["cells"]), default=0.0)
    if foreign > 0.25:
        print(f"warning: other processes used up to {foreign:.2f} CPU cores during a measured "
              "phase: latency and throughput figures are skewed", file=sys.stderr)
    print(json.dumps({"goals": result["goals"], "headline": {
        t: v["headline"] for t, v in result["comparison"].items()}}, indent=2))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2))
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(table(result["summary"], result["comparison"], markdown=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
