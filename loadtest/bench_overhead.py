"""Router overhead benchmark: the same closed-loop load sent directly to the engines and
through routers: ours (one or more configurations) and optionally sglang-router /
vllm-router.

Starts a fast-mode simulator and the routers on free loopback ports (loadtest/procs.py),
then for each repeat x mode (stream / plain) x concurrency x target runs a warm-up phase
and a measured phase of chat requests (16 tokens). Targets are interleaved within each
repeat, so that drift and foreign load hit all of them alike. Reports req/s, latency
percentiles (p50 ... p99.9), the latency each router adds over direct (per repeat, then
median and range), the throughput ratio and CPU-ms per request of each process tree.

sglang-router runs with loadtest/nodelay_shim.c preloaded (TCP_NODELAY on its sockets;
without it every streamed reply waits ~40 ms on Nagle), shown as target "sglang+nodelay";
--no-nodelay-shim runs it as shipped.

    python -m loadtest.bench_overhead [--workers 1] [--concurrency 1,64] [--modes stream,plain]
        [--requests 4000 | --duration S] [--repeats 3] [--router NAME=ARGS ...]
        [--peer sglang|vllm|all] [--sglang-policy P] [--vllm-policy P] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loadtest import overhead_targets, paired_cells
from loadtest.loadgen import LoadGen, chat_body, install_uvloop, summarize
from loadtest.procs import HOST, Engines, Proc, StartError, busy_cpu_s, nodelay_shim, peer_available, \
    start_peer, start_router, start_simulator, tree_cpu_s, tree_size

MODES = ("stream", "plain")
PCTS = ("p50", "p90", "p99", "p999")


# --------------------------------------------------------------------------------- cells


async def run_cell(a, target: str, mode: str, urls: list[str], conc: int, roots: dict[str, int],
                   engines: Engines) -> dict:
    engines.reset()
    gen = LoadGen(urls, conc, body=chat_body(a.model, a.max_tokens, stream=mode == "stream"),
                  client=a.client, timeout_s=a.request_timeout, headers=dict(a.header))
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
    return {"target": target, "mode": mode, "concurrency": conc, **cell}


def _median(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def _cells(cells: list[dict], t: str, mode: str, c: int) -> list[dict]:
    return [x for x in cells if x["target"] == t and x["mode"] == mode and x["concurrency"] == c]


def aggregate(cells: list[dict], targets: list[str], modes: list[str], concs: list[int]) -> dict:
    """target -> mode -> concurrency -> medians over repeats."""
    out: dict = {}
    for t in targets:
        for m in modes:
            for c in concs:
                rs = _cells(cells, t, m, c)
                if not rs:
                    continue
                out.setdefault(t, {}).setdefault(m, {})[str(c)] = {
                    "repeats": len(rs),
                    "rps": _median([x["rps"] for x in rs]),
                    "latency_ms": {k: _median([x["latency_ms"][k] for x in rs]) for k in PCTS},
                    "ttft_ms": {k: _median([x["ttft_ms"][k] for x in rs]) for k in PCTS},
                    "cpu_ms_per_req": {
                        k: _median([x["cpu_ms_per_req"][k] for x in rs]) for k in rs[0]["cpu_ms_per_req"]
                    },
                    "errors": sum(x["errors"] for x in rs),
                    "foreign_cpu_cores_max": max(x["foreign_cpu_cores"] for x in rs),
                }
    return out


def _added(cells: list[dict], t: str, mode: str, c: int, key: str, pct: str) -> list[float]:
    """Per repeat: the target's percentile minus direct's in the same repeat."""
    direct = {x["repeat"]: x for x in _cells(cells, "direct", mode, c)}
    out = []
    for x in _cells(cells, t, mode, c):
        d = direct.get(x["repeat"])
        if d is not None and x[key][pct] is not None and d[key][pct] is not None:
            out.append(x[key][pct] - d[key][pct])
    return out


def compare(cells: list[dict], summary: dict, modes: list[str], concs: list[int]) -> dict:
    """Each router against direct, per mode: added latency (median and range over
    repeats), throughput ratio, its CPU per request."""
    direct = summary.get("direct", {})
    out: dict = {}
    for t, per_mode in summary.items():
        if t == "direct":
            continue
        for m in modes:
            rows = {}
            for c in concs:
                r, d = per_mode.get(m, {}).get(str(c)), direct.get(m, {}).get(str(c))
                if not r or not d:
                    continue
                row: dict = {}
                for pct in ("p50", "p99", "p999"):
                    runs = _added(cells, t, m, c, "latency_ms", pct)
                    row[f"added_{pct}_ms"] = _median(runs)
                    row[f"added_{pct}_ms_runs"] = runs
                row["added_ttft_p50_ms"] = _median(_added(cells, t, m, c, "ttft_ms", "p50"))
                row["throughput_ratio"] = r["rps"] / d["rps"] if d["rps"] else None
                row["cpu_ms_per_req"] = r["cpu_ms_per_req"].get(t)
                rows[str(c)] = row
            if not rows:
                continue
            lo, hi = str(min(concs)), str(max(concs))
            head = {
                f"added_p50_ms_at_c{lo}": rows.get(lo, {}).get("added_p50_ms"),
                f"added_p99_ms_at_c{lo}": rows.get(lo, {}).get("added_p99_ms"),
                f"added_p99_ms_at_c{hi}": rows.get(hi, {}).get("added_p99_ms"),
                f"throughput_ratio_at_c{hi}": rows.get(hi, {}).get("throughput_ratio"),
                f"cpu_ms_per_req_at_c{lo}": rows.get(lo, {}).get("cpu_ms_per_req"),
                f"cpu_ms_per_req_at_c{hi}": rows.get(hi, {}).get("cpu_ms_per_req"),
            }
            out.setdefault(t, {})[m] = {"headline": head, "by_concurrency": rows}
    return out


# ------------------------------------------------------------------------------- output


def _f(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _range(row: dict | None, key: str) -> str:
    """"median (min..max)" over repeats."""
    if not row or row.get(key) is None:
        return "-"
    runs = row.get(f"{key}_runs") or []
    if len(runs) < 2:
        return _f(row[key], 2)
    return f"{_f(row[key], 2)} ({_f(min(runs), 2)}..{_f(max(runs), 2)})"


def headline_table(comparison: dict, concs: list[int], markdown: bool = False) -> str:
    """The issue's overhead table: added p50 at the lowest concurrency (stream), added p99
    at the lowest and highest (plain and stream), CPU per streamed request at the highest."""
    lo, hi = str(min(concs)), str(max(concs))
    head = ["router", f"added p50 c={lo} stream", f"added p99 c={lo} stream", f"added p99 c={hi} plain",
            f"added p99 c={hi} stream", f"added p99.9 c={hi} stream", f"cpu ms/req c={hi} stream"]
    rows = []
    for t, per_mode in comparison.items():
        s = per_mode.get("stream", {}).get("by_concurrency", {})
        p = per_mode.get("plain", {}).get("by_concurrency", {})
        rows.append([t, _range(s.get(lo), "added_p50_ms"), _range(s.get(lo), "added_p99_ms"),
                     _range(p.get(hi), "added_p99_ms"), _range(s.get(hi), "added_p99_ms"),
                     _range(s.get(hi), "added_p999_ms"), _f((s.get(hi) or {}).get("cpu_ms_per_req"), 3)])
    return _render(head, rows, markdown)


def table(summary: dict, comparison: dict, markdown: bool = False) -> str:
    head = ["target", "mode", "conc", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "ttft p50", "ttft p99",
            "cpu ms/req (target)", "sim cpu ms/req", "loadgen cpu ms/req", "errors", "foreign cores"]
    rows = []
    for t, per_mode in summary.items():
        for m, per_c in per_mode.items():
            for c, s in per_c.items():
                cpu, lat = s["cpu_ms_per_req"], s["latency_ms"]
                rows.append([
                    t, m, c, _f(s["rps"], 0), _f(lat["p50"], 3), _f(lat["p90"], 3), _f(lat["p99"], 3),
                    _f(lat["p999"], 3), _f(s["ttft_ms"]["p50"], 3), _f(s["ttft_ms"]["p99"], 3),
                    _f(cpu.get(t), 3) if t != "direct" else "-", _f(cpu.get("simulator"), 3),
                    _f(cpu.get("loadgen"), 3), str(s["errors"]), _f(s["foreign_cpu_cores_max"]),
                ])
    head2 = ["router", "mode", "conc", "added p50 ms", "added p99 ms", "added p99.9 ms", "added ttft p50 ms",
             "throughput ratio", "cpu ms/req"]
    rows2 = [
        [t, m, c, _range(v, "added_p50_ms"), _range(v, "added_p99_ms"), _range(v, "added_p999_ms"),
         _f(v["added_ttft_p50_ms"], 3), _f(v["throughput_ratio"], 3), _f(v["cpu_ms_per_req"], 3)]
        for t, per_mode in comparison.items() for m, cmp in per_mode.items()
        for c, v in cmp["by_concurrency"].items()
    ]
    return _render(head, rows, markdown) + "\n\n" + _render(head2, rows2, markdown)


def paired_table(paired_comparison: dict, markdown: bool = False) -> str:
    """Added latency from the paired cells (every target in the same window)."""
    head = ["router (paired)", "mode", "conc", "added p50 ms", "added p99 ms", "added p99.9 ms"]
    rows = [[t, m, c, _range(v, "added_p50_ms"), _range(v, "added_p99_ms"), _range(v, "added_p999_ms")]
            for t, per_mode in paired_comparison.items() for m, per_c in per_mode.items()
            for c, v in per_c.items()]
    return _render(head, rows, markdown) if rows else ""


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
    p.add_argument("--modes", default="stream", help="comma-separated: stream, plain (non-streamed)")
    p.add_argument("--requests", type=int, help="measured requests per cell (default 4000 "
                   "unless --duration is given; with both, the first reached ends the cell)")
    p.add_argument("--duration", type=float, help="measured seconds per cell")
    p.add_argument("--warmup", type=int, default=200, help="warm-up requests per cell (at least C)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--router", action="append", default=[], metavar="NAME=ARGS",
                   help="one of our routers with extra CLI arguments, e.g. "
                        "'prefix=--router-config configs/scheduling/prefix-cache.yaml' (repeatable; "
                        "default: one named 'router' with --router-args)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="run router NAME from another source tree (e.g. `git archive` of an older commit; "
                        "run from a directory without a kthena_router package)")
    p.add_argument("--router-args", default="", help="extra arguments of the default router")
    p.add_argument("--peer", choices=["none", "sglang", "vllm", "all"], default="none")
    p.add_argument("--peer-policy", default="round_robin", help="default policy of both peers")
    p.add_argument("--sglang-policy", help="sglang-router's policy (default --peer-policy)")
    p.add_argument("--vllm-policy", help="vllm-router's policy (default --peer-policy)")
    p.add_argument("--no-nodelay-shim", dest="nodelay_shim", action="store_false",
                   help="run sglang-router without the TCP_NODELAY preload shim")
    p.add_argument("--paired", default="1", metavar="CONCS",
                   help="concurrencies at which each repeat also runs one latency cell per mode whose "
                        "requests rotate over every target one by one (loadtest/paired_cells.py); "
                        "the targets' low-concurrency latency checks use them ('' for none)")
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--model", default="demo")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--client", choices=["raw", "aiohttp"], default="raw", help="load generator client")
    p.add_argument("--header", action="append", default=[], type=_header, metavar="'NAME: VALUE'",
                   help="extra request header sent to every target (e.g. an API key for a router with auth)")
    p.add_argument("--sim-args", default="", help="extra simulator arguments")
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
    a.paired_concs = sorted({int(x) for x in a.paired.split(",") if x.strip()} & set(a.concs))
    a.mode_list = [m for m in MODES if m in {x.strip() for x in a.modes.split(",")}]
    if not a.mode_list:
        p.error(f"--modes: choose from {', '.join(MODES)}")
    routers = {}
    for spec in a.router or [f"router={a.router_args}"]:
        name, sep, args = spec.partition("=")
        if not sep or not name or name == "direct" or name in routers:
            p.error(f"--router {spec!r}: want a unique NAME=ARGS (NAME not 'direct')")
        routers[name] = args
    a.routers = routers
    a.trees = dict(t.split("=", 1) for t in a.tree)
    return a


async def bench(a, logdir: Path, procs: list[Proc]) -> dict:
    load0 = os.getloadavg()
    sim, ports, admin = start_simulator(a.engines, a.model, a.sim_args, logdir, procs, a.start_timeout)
    engines = Engines(admin)
    routers: dict[str, tuple[Proc, str]] = {
        name: start_router(name, a.model, a.workers, args, logdir, ports, procs, a.start_timeout, dict(a.header),
                           tree=a.trees.get(name))
        for name, args in a.routers.items()
    }
    skipped, peers = {}, {}
    for peer in {"none": [], "all": ["sglang", "vllm"]}.get(a.peer, [a.peer]):
        why = peer_available(peer)
        if why:
            print(f"skipping {peer}: {why}", file=sys.stderr)
            skipped[peer] = why
            continue
        policy = (a.sglang_policy if peer == "sglang" else a.vllm_policy) or a.peer_policy
        shim = nodelay_shim() if peer == "sglang" and a.nodelay_shim else None
        name = f"{peer}+nodelay" if shim else peer
        routers[name] = start_peer(peer, policy, a.model, logdir, ports, procs, a.start_timeout, preload=shim)
        peers[name] = {"policy": policy, "ld_preload": str(shim) if shim else None}
    roots = {"simulator": sim.pid, **{name: p.pid for name, (p, _) in routers.items()}}
    direct = [f"http://{HOST}:{p}" for p in ports]
    targets = {"direct": direct, **{name: [url] for name, (_, url) in routers.items()}}
    tree_sizes = {name: tree_size(routers[name][0].pid) for name in a.routers}

    cells: list[dict] = []
    paired: list[dict] = []
    for rep in range(a.repeats):
        for m in a.mode_list:
            for c in a.concs:
                for t, urls in targets.items():  # interleaved, so that drift hits all targets alike
                    cell = await run_cell(a, t, m, urls, c, roots, engines)
                    cell["repeat"] = rep
                    cells.append(cell)
                    lat = cell["latency_ms"]
                    print(
                        f"[{rep}] {t:>14} {m:>6} c={c:<3} {cell['rps']:8.0f} req/s  p50 {_f(lat['p50'], 3)}"
                        f"  p99 {_f(lat['p99'], 3)}  p99.9 {_f(lat['p999'], 3)} ms"
                        f"  cpu {_f(cell['cpu_ms_per_req'].get(t), 3)} ms/req  errors {cell['errors']}"
                        f"  foreign load {cell['foreign_cpu_cores']:.2f} cores",
                        file=sys.stderr,
                    )
        for m in a.mode_list:
            for c in a.paired_concs:
                for cell in await paired_cells.run_paired(a, m, c, targets, engines):
                    cell["repeat"] = rep
                    paired.append(cell)
                    lat = cell["latency_ms"]
                    print(f"[{rep}] {cell['target']:>14} {m:>6} c={c:<3} paired      p50 {_f(lat['p50'], 3)}"
                          f"  p99 {_f(lat['p99'], 3)}  p99.9 {_f(lat['p999'], 3)} ms  errors {cell['errors']}",
                          file=sys.stderr)
    summary = aggregate(cells, list(targets), a.mode_list, a.concs)
    comparison = compare(cells, summary, a.mode_list, a.concs)
    return {
        "meta": {
            "machine": machine_info(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "router_process_tree_size": tree_sizes.get("router", max(tree_sizes.values())),
            "router_process_tree_sizes": tree_sizes,
            "peers": peers,
            "skipped_peers": skipped,
            "loadgen_client": a.client,
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "cells": cells,
        "summary": summary,
        "comparison": comparison,
        "paired_cells": paired,
        "paired_comparison": paired_cells.compare(paired),
        "goals": overhead_targets.targets(cells, list(a.routers), a.concs, paired=paired),
    }


def _raise_interrupt(*_) -> None:
    raise KeyboardInterrupt


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"want 'NAME: VALUE', got {text!r}")
    return name.strip(), value.strip()


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

    summary, comparison = result["summary"], result["comparison"]
    print(table(summary, comparison) + "\n\n" + headline_table(comparison, a.concs)
          + "\n\n" + paired_table(result["paired_comparison"]))
    for name, info in result["meta"]["peers"].items():
        if info["ld_preload"]:
            print(f"{name}: policy {info['policy']}, LD_PRELOAD={info['ld_preload']} (loadtest/nodelay_shim.c)")
    foreign = max((c["foreign_cpu_cores"] for c in result["cells"]), default=0.0)
    if foreign > 0.25:
        print(f"warning: other processes used up to {foreign:.2f} CPU cores during a measured "
              "phase: latency and throughput figures are skewed", file=sys.stderr)
    print(json.dumps({"goals": result["goals"]["all_runs"], "headline": {
        t: {m: v["headline"] for m, v in per_mode.items()} for t, per_mode in comparison.items()}}, indent=2))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2))
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(table(summary, comparison, markdown=True) + "\n\n"
                              + headline_table(comparison, a.concs, markdown=True) + "\n\n"
                              + paired_table(result["paired_comparison"], markdown=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
