"""Where a router worker's CPU goes: per-thread CPU (from /proc) under closed-loop load,
and optionally a py-spy sample of the worker.

Starts a fast-mode simulator and one router per `--router NAME=ARGS` (1 worker each), then
runs the same load against each in turn (interleaved over `--repeats`) and prints, per
router, CPU ms per request of each of the worker's threads (by thread name: the event
loop's is the worker's main thread, granian's Rust runtime threads are named by tokio)
and of the router's parent.

    python -m loadtest.profile_worker --router asgi="--interface asgi" --router rsgi="--interface rsgi" \
        [--concurrency 16] [--mode stream|plain] [--duration 6] [--repeats 2] [--rate R] [--py-spy OUT_PREFIX]

`--tree NAME=DIR` runs router NAME from another source tree; `--together --rate R` loads
all routers at the same time, each at R req/s, so that the machine's other load hits
them alike (the fairest A/B on a shared machine). `--rate R` paces the requests (R per second over the C connections) so that every router
runs at the same throughput: CPU per request then compares at equal batching, which a
closed loop on a busy machine does not give.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.loadgen import LoadGen, PhaseResult, chat_body, install_uvloop, summarize
from loadtest.procs import HOST, Proc, free_ports, http, probe_chat, router_config, start_router, start_simulator, \
    wait_until

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if int(raw[raw.rfind(b")") + 2:].split()[1]) == pid:
                out.append(int(d))
    return out


def thread_cpu(pid: int) -> dict[str, float]:
    """Thread name -> CPU seconds (threads of one name summed); "NAME:sys" its kernel share."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.find(b"(") + 1:raw.rfind(b")")].decode(errors="replace")
        name = "main(loop)" if tid == str(pid) else name
        fields = raw[raw.rfind(b")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _CLK_TCK
        out[name + ":sys"] = out.get(name + ":sys", 0.0) + int(fields[12]) / _CLK_TCK
    return out


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


async def paced(gen: LoadGen, rate: float, duration_s: float) -> PhaseResult:
    """Request i starts at i / rate (or when one of the C connections is free): the same
    throughput for every router, so that CPU per request compares at equal batching."""
    res = PhaseResult()
    client = gen._client
    loop = asyncio.get_running_loop()
    start = loop.time()
    n = int(rate * duration_s)
    tickets = iter(range(n))

    async def worker(state: dict) -> None:
        for i in tickets:
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            res.samples.append(await client.one(state, 0))

    await asyncio.gather(*(worker(s) for s in gen._states))
    res.wall_s = loop.time() - start
    return res


def _role(pid: int) -> str:
    """A router child's role: "worker" (granian names its worker processes after the router,
    "kthena-router N"), else "other" (the pod-state hub, multiprocessing's resource tracker)."""
    with open(f"/proc/{pid}/comm") as f:
        return "worker" if f.read().startswith("kthena-router") else "other"


def children_cpu(pids: list[int]) -> dict[str, float]:
    """thread_cpu summed over processes, each name prefixed by its process's role."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            role = _role(pid)
            threads = thread_cpu(pid)
        except OSError:
            continue
        for k, v in threads.items():
            key = k if role == "worker" else f"{role}:{k}"
            out[key] = out.get(key, 0.0) + v
    return out


async def measure(url: str, parent: int, a: argparse.Namespace, spy: str | None) -> dict:
    kids = _children(parent)
    worker = max(kids, key=lambda p: len(os.listdir(f"/proc/{p}/task")))  # not the resource tracker
    gen = LoadGen([url], a.concurrency, body=chat_body("demo", a.max_tokens, stream=a.mode == "stream"))
    try:
        await gen.run(requests=max(200, 20 * a.concurrency))
        spy_proc = None
        if spy:
            spy_proc = subprocess.Popen([a.py_spy_bin, "record", "-r", "250", "-f", "raw", "--nonblocking",
                                         "-d", str(int(a.duration)), "-p", str(worker), "-o", spy],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0, p0 = children_cpu(kids), proc_cpu(parent)
        res = await (paced(gen, a.rate, a.duration) if a.rate else gen.run(duration_s=a.duration))
        t1, p1 = children_cpu(kids), proc_cpu(parent)
        if spy_proc is not None:
            spy_proc.wait(timeout=60)
    finally:
        await gen.close()
    n = max(1, len(res.samples))
    per = {k: 1000 * (t1[k] - t0.get(k, 0.0)) / n for k in t1}
    per = {k: v for k, v in per.items() if v >= 0.001}
    sys_ = {k[:-4]: v for k, v in per.items() if k.endswith(":sys")}
    per = {k: v for k, v in per.items() if not k.endswith(":sys")}
    per["parent"] = 1000 * (p1 - p0) / n
    cell = summarize(res)
    return {"threads": per, "sys": sys_, "total": sum(per.values()), "rps": cell["rps"], "p50": cell["latency_ms"]["p50"],
            "p99": cell["latency_ms"]["p99"], "errors": cell["errors"]}


def start_tree_router(name: str, tree: str, args: str, logdir: Path, ports: list[int],
                      procs: list[Proc], workers: int = 1) -> tuple[Proc, str]:
    """Our router from another source tree (e.g. an older commit's `git archive`): its
    directory goes first on sys.path (spawned workers inherit it)."""
    port, admin = free_ports(2)
    cfg = logdir / f"{name}.yaml"
    cfg.write_text(router_config("demo", ports))
    boot = (f"import sys; sys.path.insert(0, {tree!r}); sys.argv[0] = 'kthena-router'; "
            "from kthena_router.cli import main; sys.exit(main())")
    cmd = [sys.executable, "-c", boot, "--config", str(cfg), "--host", HOST, "--port", str(port), "--admin-host",
           HOST, "--admin-port", str(admin), "--workers", str(workers), "--log-level", "warning", *shlex.split(args)]
    # spawned workers do not inherit sys.path: PYTHONPATH makes them import the tree's code too
    p = Proc(name, cmd, logdir, env={"PYTHONPATH": tree})
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: http("GET", f"http://{HOST}:{admin}/readyz")[0] == 200, p, 60, "/readyz 200")
    wait_until(lambda: probe_chat(url, "demo"), p, 60, "successful chat request")
    return p, url


async def main_async(a: argparse.Namespace) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="kthena-prof-"))
    procs: list[Proc] = []
    try:
        _, ports, _ = start_simulator(a.engines, "demo", "", logdir, procs, 60)
        routers = {}
        trees = dict(t.split("=", 1) for t in a.tree)
        for spec in a.router:
            name, _, args = spec.partition("=")
            if name in trees:
                p, url = start_tree_router(name, trees[name], args, logdir, ports, procs, a.workers)
            else:
                p, url = start_router(name, "demo", a.workers, args, logdir, ports, procs, 60)
            routers[name] = (p, url)
        results: dict[str, list[dict]] = {n: [] for n in routers}
        for rep in range(a.repeats):
            if a.together:  # all routers loaded at once: foreign load hits them alike
                cells = await asyncio.gather(*(measure(url, p.popen.pid, a, None) for p, url in routers.values()))
                for name, cell in zip(routers, cells):
                    results[name].append(cell)
                continue
            for name, (p, url) in routers.items():
                spy = f"{a.py_spy}-{name}-{rep}.txt" if a.py_spy and rep == a.repeats - 1 else None
                results[name].append(await measure(url, p.popen.pid, a, spy))
        la = os.getloadavg()
        print(f"load average {la[0]:.2f} {la[1]:.2f}; c={a.concurrency} {a.mode}, {a.duration}s x {a.repeats}"
              + (f", paced at {a.rate:g} req/s" if a.rate else ", closed loop"))
        for name, runs in results.items():
            keys = sorted({k for r in runs for k in r["threads"]})
            med = {k: statistics.median(r["threads"].get(k, 0.0) for r in runs) for k in keys}
            print(f"{name}: cpu ms/req total {statistics.median(r['total'] for r in runs):.3f} "
                  f"(runs {', '.join('%.3f' % r['total'] for r in runs)}); rps "
                  f"{statistics.median(r['rps'] for r in runs):.0f}; p50 {statistics.median(r['p50'] for r in runs):.2f} "
                  f"p99 {statistics.median(r['p99'] for r in runs):.2f} ms; errors {sum(r['errors'] for r in runs)}")
            for k, v in sorted(med.items(), key=lambda kv: -kv[1]):
                sys_ = statistics.median(r["sys"].get(k, 0.0) for r in runs)
                print(f"    {k:<20} {v:.3f}  (kernel {sys_:.3f})")
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(logdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--router", action="append", default=[], metavar="NAME=ARGS")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--mode", choices=["stream", "plain"], default="stream")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="router workers (threads of the same name summed "
                   "over them; the pod-state hub's as other:NAME)")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--rate", type=float, default=0.0, help="paced requests/s (default: closed loop)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="run router NAME from another source tree (e.g. `git archive` of an older commit)")
    p.add_argument("--together", action="store_true",
                   help="load all routers at the same time (use with --rate): equal conditions for each")
    p.add_argument("--py-spy", help="output prefix of py-spy raw samples (last repeat)")
    p.add_argument("--py-spy-bin", default=str(Path(sys.executable).parent / "py-spy"))
    a = p.parse_args(argv)
    if not a.router:
        a.router = ["ours="]
    install_uvloop()
    asyncio.run(main_async(a))


if __name__ == "__main__":
    main()
