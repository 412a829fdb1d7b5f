"""One cell's processes: the simulator (2 engines) and our router in front of them.

Cells (all: vLLM flavour, the 8B model on the H200 calibration, block size 16,
max-num-seqs 256, max-num-batched-tokens 8192, the computed H200 KV capacity):
- agg:        2 aggregated engines (`--roles both,both`), one ModelServer;
- pd:         1 prefill + 1 decode engine (`--roles prefill,decode`), a ModelServer with
              workloadSelector.pdGroup and kvConnector nixl (the KV is read by the decode
              engine over the simulated 400 Gb/s link; the decode does not recompute);
- agg-cN:     as agg with max-num-batched-tokens N (smaller prefill chunks per step: the
              aggregated engines' own remedy for prefill interference, vLLM's chunked
              prefill; optional, for the comparison's honesty);
- pd-cond-N:  as pd, with the router's pd.minUncachedTokens = N (conditional
              disaggregation: a request whose uncached prompt part on the chosen decode
              engine is below N tokens is served by the decode engine alone).
Every cell's router uses the same scheduler (our recommended one,
configs/scheduling/best.yaml); the PD cells leave the pd section's decode/prefill plugins
at their defaults.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.procs import HOST, Proc, StartError, free_ports, http, probe_chat, router_config, wait_until

MODEL = "llama-3-8b-sim"
BLOCK_SIZE = 16
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192
BEST_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "scheduling" / "best.yaml"


@dataclass(frozen=True)
class Cell:
    name: str
    roles: tuple[str, str]
    min_uncached_tokens: int | None = None  # None: not a PD cell; 0: always two hops
    max_num_batched_tokens: int | None = None  # None: the run's --max-num-batched-tokens

    @property
    def is_pd(self) -> bool:
        return self.min_uncached_tokens is not None


AGG = Cell("agg", ("both", "both"))
PD = Cell("pd", ("prefill", "decode"), 0)


def pd_cond(n: int) -> Cell:
    return Cell(f"pd-cond-{n}", ("prefill", "decode"), n)


def parse_cells(spec: str, min_uncached: list[int]) -> list[Cell]:
    """`agg,pd,pd-cond` -> cells; pd-cond expands to one cell per --min-uncached value."""
    out: list[Cell] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name == "agg":
            out.append(AGG)
        elif name == "pd":
            out.append(PD)
        elif name == "pd-cond":
            out.extend(pd_cond(n) for n in min_uncached)
        elif name.startswith("pd-cond-") and name[8:].isdigit() and int(name[8:]) > 0:
            out.append(pd_cond(int(name[8:])))
        elif name.startswith("agg-c") and name[5:].isdigit() and int(name[5:]) >= 16:
            out.append(Cell(name, ("both", "both"), max_num_batched_tokens=int(name[5:])))
        else:
            raise ValueError(f"unknown cell {name!r}; known: agg, agg-cN (N >= 16), pd, pd-cond, "
                             f"pd-cond-N")
    if len({c.name for c in out}) != len(out):
        raise ValueError(f"a cell is listed twice in {spec!r}")
    return out


def simulator_cmd(cell: Cell, ports: list[int], admin: int, time_scale: float, seed: int,
                  kv_bandwidth_gbps: float, max_num_batched_tokens: int, extra: str) -> list[str]:
    return [sys.executable, "-m", "loadtest.simulator", "--engines", "2", "--host", HOST,
            "--ports", ",".join(map(str, ports)), "--admin-port", str(admin),
            "--model", MODEL, "--flavour", "vllm", "--roles", ",".join(cell.roles),
            "--kv-bandwidth-gbps", repr(kv_bandwidth_gbps), "--block-size", str(BLOCK_SIZE),
            "--max-num-seqs", str(MAX_NUM_SEQS),
            "--max-num-batched-tokens", str(cell.max_num_batched_tokens or max_num_batched_tokens),
            "--time-scale", repr(time_scale), "--seed", str(seed), *shlex.split(extra)]


def routes_yaml(cell: Cell, ports: list[int]) -> str:
    """ModelRoute + ModelServer + file-mode Endpoints (labels per endpoint; NIXL for PD)."""
    return router_config(MODEL, ports, pd_roles=cell.roles if cell.is_pd else None)


def router_config_yaml(cell: Cell, prefill_timeout: str) -> str:
    """The --router-config file: our recommended scheduler, plus the pd section for PD cells."""
    # the scheduler of configs/scheduling/best.yaml (comments left out)
    text = "".join(line for line in BEST_CONFIG.read_text().splitlines(keepends=True)
                   if not line.startswith("#"))
    if cell.is_pd:
        text += (f"pd:\n  prefillTimeout: {prefill_timeout}\n"
                 f"  minUncachedTokens: {cell.min_uncached_tokens}\n")
    return text


@dataclass
class Started:
    url: str  # the router
    admin_url: str  # the simulator's admin API
    router_admin_url: str
    engine_ports: list[int]


def write_configs(cell: Cell, logdir: Path, ports: list[int], prefill_timeout: str) -> tuple[Path, Path]:
    routes, rcfg = logdir / "routes.yaml", logdir / "router-config.yaml"
    routes.write_text(routes_yaml(cell, ports))
    rcfg.write_text(router_config_yaml(cell, prefill_timeout))
    return routes, rcfg


def router_cmd(routes: Path, rcfg: Path, port: int, admin: int, extra: str) -> list[str]:
    return [sys.executable, "-m", "kthena_router.cli", "--config", str(routes),
            "--router-config", str(rcfg), "--host", HOST, "--port", str(port),
            "--admin-host", HOST, "--admin-port", str(admin), "--workers", "1",
            "--log-level", "warning", *shlex.split(extra)]


def start(cell: Cell, logdir: Path, procs: list[Proc], *, time_scale: float, seed: int,
          kv_bandwidth_gbps: float, max_num_batched_tokens: int, prefill_timeout: str,
          sim_args: str = "", router_args: str = "", timeout_s: float = 60.0) -> Started:
    *ports, admin, rport, radmin = free_ports(5)
    sim = Proc("simulator", simulator_cmd(cell, ports, admin, time_scale, seed, kv_bandwidth_gbps,
                                          max_num_batched_tokens, sim_args), logdir)
    procs.append(sim)

    def ready() -> bool:
        return any(line.startswith("{") and json.loads(line).get("ready")
                   for line in sim.out_path.read_text(errors="replace").splitlines())

    wait_until(ready, sim, timeout_s, "ready line")
    routes, rcfg = write_configs(cell, logdir, ports, prefill_timeout)
    router = Proc("router", router_cmd(routes, rcfg, rport, radmin, router_args), logdir)
    procs.append(router)
    url = f"http://{HOST}:{rport}"
    wait_until(lambda: http("GET", f"http://{HOST}:{radmin}/readyz")[0] == 200, router,
               timeout_s, "/readyz 200")
    # one short request through the router: for PD cells, both hops work end to end
    wait_until(lambda: probe_chat(url, MODEL), router, timeout_s, "a successful chat request")
    return Started(url, f"http://{HOST}:{admin}", f"http://{HOST}:{radmin}", ports)


def engine_states(admin_url: str) -> list[dict]:
    status, data = http("GET", f"{admin_url}/admin/engines/*/state")
    if status != 200:
        raise StartError(f"simulator admin state: HTTP {status}")
    return json.loads(data)


def reset_engines(admin_url: str) -> None:
    """Per-phase counters (request logs, PD counters) from zero."""
    for i in (0, 1):
        http("POST", f"{admin_url}/admin/engines/{i}/requests/reset", b"{}")
