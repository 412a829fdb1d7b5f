"""The cluster of one benchmark cell: 3 simulated engines and what routes to them.

Engines: vLLM flavour, the 8B model on the H200 calibration (the simulator's default
table), max-num-seqs 256 and max-num-batched-tokens 8192 (vLLM's defaults for online
serving on a large GPU; Kthena's setup also used 256), block size 16.

Block size: a real vLLM deployment on H100/H200 keeps the default, 16 (the attention
backends' native page size; prefix caching matches whole blocks, so 16 loses at most 15
tokens of a hit). Kthena's benchmark set 128, which only coarsens hits (4096 / 128 fits
exactly, so that workload loses nothing either way). We use 16.

KV capacity: the computed capacity of one H200 (141 GB x 0.9 - 16 GB of weights ->
~53k blocks of 16, ~850k tokens) is "1x" for the published workload; a scaled-down
profile scales it by its distinct prefix tokens, so that every ratio of the published
setup holds. The published regime is kv_factor 0.5: 256 x 4096 prefix tokens need
~2.5x one engine's KV.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.procs import (
    HOST, Proc, StartError, free_ports, http, peer_available, probe_chat, router_config,
    wait_until,
)
from loadtest.simulator.engine import EngineConfig, compute_num_gpu_blocks
from .policies import MODEL, ROUTER_CONFIG_FLAG, Policy
from .workload import PROFILES, WorkloadSpec

N_ENGINES = 3
BLOCK_SIZE = 16
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192
# SMG lives in its own venv (its dependencies must not touch the project's venv)
SMG_VENV = Path(__file__).resolve().parents[2] / ".venv-smg"
PUBLISHED_REGIME = 0.5  # kv_factor where prefixes need ~2.5x one engine's KV


def kv_blocks(spec: WorkloadSpec, kv_factor: float, block_size: int = BLOCK_SIZE) -> int:
    """Blocks per engine: the computed H200 capacity, scaled to the profile."""
    full = compute_num_gpu_blocks(EngineConfig(block_size=block_size))
    scale = spec.distinct_prefix_tokens / PROFILES["published"].distinct_prefix_tokens
    return max(1, round(full * scale * kv_factor))


@dataclass
class Cluster:
    engine_ports: list[int]
    admin_port: int
    url: str | None  # where clients send (None: straight to the engines)
    procs: list[Proc]

    @property
    def engine_urls(self) -> list[str]:
        return [f"http://{HOST}:{p}" for p in self.engine_ports]

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.admin_port}"

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def kv_event_addresses(base: int) -> list[tuple[str, str]]:
    """(PUB, replay) ZMQ addresses of each engine (DP 1), as the simulator binds them."""
    return [(f"tcp://{HOST}:{base + 2 * i}", f"tcp://{HOST}:{base + 2 * i + 1}")
            for i in range(N_ENGINES)]


def start_engines(logdir: Path, procs: list[Proc], num_blocks: int, time_scale: float,
                  seed: int, timeout_s: float = 30.0,
                  kv_events_base: int | None = None,
                  extra_args: tuple[str, ...] = ()) -> tuple[list[int], int]:
    *ports, admin = free_ports(N_ENGINES + 1)
    cmd = [sys.executable, "-m", "loadtest.simulator", "--engines", str(N_ENGINES),
           "--host", HOST, "--ports", ",".join(map(str, ports)), "--admin-port", str(admin),
           "--model", MODEL, "--flavour", "vllm", "--block-size", str(BLOCK_SIZE),
           "--kv-blocks", str(num_blocks), "--time-scale", repr(time_scale),
           "--max-num-seqs", str(MAX_NUM_SEQS),
           "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS), "--seed", str(seed)]
    if kv_events_base is not None:
        cmd += ["--kv-events-port-base", str(kv_events_base)]
    cmd += list(extra_args)
    p = Proc("simulator", cmd, logdir)
    procs.append(p)

    def ready() -> bool:
        return any(line.startswith("{") and json.loads(line).get("ready")
                   for line in p.out_path.read_text(errors="replace").splitlines())

    wait_until(ready, p, timeout_s, "ready line")
    return ports, admin


def unavailable(policy: Policy, sched_yaml: str | None) -> str | None:
    """Why a policy cannot run here (None: it can)."""
    if policy.kind == "peer" and policy.peer == "smg":
        exe = smg_binary()
        return None if exe.exists() else f"{exe} missing: run `make peers-smg`"
    if policy.kind == "peer":
        return peer_available(policy.peer or "")
    return None


def _with_event_labels(config: str, ports: list[int], kv_events_base: int,
                       only: tuple[int, ...] | None = None) -> str:
    """Endpoints labelled with their KV-event ports (how the router finds each engine's
    event stream in file mode: kthena_router/scheduling/kv_matcher.py); `only`: just
    those engines (a mixed fleet)."""
    for i, port in enumerate(ports):
        if only is not None and i not in only:
            continue
        old = f"port: {port}, labels: {{app: bench}}"
        assert old in config, "procs.router_config changed its endpoint format"
        pub = kv_events_base + 2 * i
        config = config.replace(old, f"port: {port}, labels: {{app: bench, "
                                     f"kthena.io/kv-events-port: '{pub}', "
                                     f"kthena.io/kv-events-replay-port: '{pub + 1}'}}")
    return config


def start_router(logdir: Path, procs: list[Proc], ports: list[int], policy: Policy,
                 sched_yaml: str | None, timeout_s: float = 60.0,
                 kv_events_base: int | None = None,
                 extra_args: tuple[str, ...] = (),
                 lora_adapters: tuple[str, ...] = ()) -> tuple[str, str]:
    """Returns (proxy URL, admin URL). `lora_adapters` go on the ModelRoute
    (loraAdapters): the router sends them to the base model's ModelServer by name."""
    port, admin = free_ports(2)
    cfg = logdir / "router.yaml"
    routes = router_config(MODEL, ports)
    if kv_events_base is not None:
        routes = _with_event_labels(routes, ports, kv_events_base, policy.kv_labelled)
    if lora_adapters:
        old = f"  modelName: {MODEL}\n"
        assert old in routes, "procs.router_config changed its route format"
        routes = routes.replace(old, old + f"  loraAdapters: [{', '.join(lora_adapters)}]\n", 1)
    cfg.write_text(routes)
    extra: list[str] = []
    if sched_yaml is not None and policy.config_file is not None \
            and sched_yaml == policy.scheduler_yaml:
        extra = [ROUTER_CONFIG_FLAG, str(policy.config_file)]
    elif sched_yaml is not None:
        sched = logdir / "router-configuration.yaml"
        sched.write_text(sched_yaml)
        extra = [ROUTER_CONFIG_FLAG, str(sched)]
    cmd = [sys.executable, "-m", "kthena_router.cli", "--config", str(cfg), "--host", HOST,
           "--port", str(port), "--admin-host", HOST, "--admin-port", str(admin),
           "--workers", "1", "--log-level", "warning", *extra, *policy.router_args, *extra_args]
    p = Proc("router", cmd, logdir)
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: http("GET", f"http://{HOST}:{admin}/readyz")[0] == 200, p, timeout_s,
               "/readyz 200")
    wait_until(lambda: probe_chat(url, MODEL), p, timeout_s, "a successful chat request")
    return url, f"http://{HOST}:{admin}"


def router_counter(admin_url: str, name: str) -> float | None:
    """Sum of a counter over its label sets in the router's /metrics (None: no metrics).
    Absent counts as 0: in multiprocess mode a counter never incremented has no sample."""
    status, data = http("GET", f"{admin_url}/metrics")
    if status != 200:
        return None
    total = 0.0
    for line in data.decode(errors="replace").splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


_PEER_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
             "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def start_peer(logdir: Path, procs: list[Proc], ports: list[int], peer: str,
               timeout_s: float = 60.0, policy: str = "cache_aware",
               probe_model: str = MODEL) -> str:
    """sglang-router / vllm-router / smg with `policy` (settings: peer-routers.md)."""
    port, prom = free_ports(2)
    workers = [f"http://{HOST}:{p}" for p in ports]
    common = ["--host", HOST, "--port", str(port), "--worker-urls", *workers,
              "--policy", policy, "--prometheus-port", str(prom),
              "--prometheus-host", HOST]
    if peer == "smg":
        cmd = [str(smg_binary()), "launch", *common, "--log-level", "warn"]
    elif peer == "sglang":
        cmd = [sys.executable, "-m", "sglang_router.launch_router", *common,
               "--log-level", "warn"]
    else:
        exe = Path(sys.executable).parent / "vllm-router"
        cmd = [str(exe) if exe.exists() else (shutil.which("vllm-router") or "vllm-router"),
               *common, "--log-level", "warning", "--worker-startup-check-interval", "1"]
    p = Proc(f"{peer}-router", cmd, logdir, env=_PEER_ENV)
    procs.append(p)
    url = f"http://{HOST}:{port}"
    wait_until(lambda: probe_chat(url, probe_model), p, timeout_s, "a successful chat request")
    return url


def smg_binary() -> Path:
    """SMG's command: $SMG_BIN, else the project's own venv (`make peers-smg`)."""
    env = os.environ.get("SMG_BIN")
    return Path(env) if env else SMG_VENV / "bin" / "smg"


def engine_ttft_totals(engine_urls: list[str]) -> tuple[float, float]:
    """(sum, count) of the engines' own TTFT histograms (simulated seconds): the engine-side
    part of what the client measures, so that the rest (router, client) can be told apart."""
    total = count = 0.0
    for url in engine_urls:
        status, data = http("GET", f"{url}/metrics")
        if status != 200:
            raise StartError(f"engine {url} /metrics: HTTP {status}")
        for line in data.decode(errors="replace").splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name == "vllm:time_to_first_token_seconds_sum":
                total += float(line.rsplit(" ", 1)[1])
            elif name == "vllm:time_to_first_token_seconds_count":
                count += float(line.rsplit(" ", 1)[1])
    return total, count


def engine_states(admin_url: str) -> list[dict]:
    status, data = http("GET", f"{admin_url}/admin/engines/*/state")
    if status != 200:
        raise StartError(f"simulator admin state: HTTP {status}")
    return json.loads(data)



def start_redis(logdir: Path, procs: list[Proc], timeout_s: float = 30.0) -> str:
    """A fresh redis-server (no persistence) for one cell; its host:port."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    [port] = free_ports(1)
    p = Proc("redis", [exe, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                       "--dir", str(logdir), "--protected-mode", "no"], logdir)
    procs.append(p)

    def pong() -> bool:
        with socket.create_connection((HOST, port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    wait_until(pong, p, timeout_s, "PONG")
    return f"{HOST}:{port}"


def with_shared_index(sched_yaml: str | None, redis_address: str, sync_interval: str = "50ms") -> str:
    """The routerConfiguration plus a sharedPrefixIndex section on this Redis."""
    return (sched_yaml or "") + (f"sharedPrefixIndex:\n  redis: {{address: '{redis_address}'}}\n"
                                 f"  syncInterval: {sync_interval}\n")


# The router's deadlines that a request's engine time runs into, as (section, YAML key,
# field of kthena_router's defaults). Connect is a local TCP handshake, not engine time.
_SIM_TIME_TRAFFIC = (
    ("timeouts", "response", "response_s"), ("timeouts", "firstToken", "first_token_s"),
    ("timeouts", "idle", "idle_s"), ("timeouts", "total", "total_s"),
    ("timeouts", "poolWait", "pool_wait_s"),
    ("outlierDetection", "interval", "interval_s"),
    ("outlierDetection", "baseEjectionTime", "base_ejection_s"),
    ("outlierDetection", "maxEjectionTime", "max_ejection_s"),
    ("outlierDetection", "stallMinimum", "stall_min_s"),
)


def with_sim_time_traffic(sched_yaml: str, time_scale: float) -> str:
    """The routerConfiguration plus a `traffic` section holding the router's default
    timeouts and outlier-detection times in simulated time (wall = x time scale), as
    syncInterval: the engines run `time_scale` times slower, so a 60 s first-token
    timeout in wall time would fire on a queue that real engines drain in 60 / time_scale
    seconds, and eject busy engines no real deployment would. A policy's own `traffic`
    section is kept as written."""
    if sched_yaml.startswith("traffic:") or "\ntraffic:" in sched_yaml:
        return sched_yaml
    from kthena_router.config.traffic import DEFAULT_TRAFFIC  # the defaults, not a copy

    defaults = {"timeouts": DEFAULT_TRAFFIC.defaults.timeouts,
                "outlierDetection": DEFAULT_TRAFFIC.defaults.outlier}
    sections: dict[str, list[str]] = {}
    for section, key, field_name in _SIM_TIME_TRAFFIC:
        seconds = getattr(defaults[section], field_name)
        if seconds:  # None or 0: off, and off stays off
            sections.setdefault(section, []).append(f"{key}: {round(seconds * time_scale * 1000)}ms")
    body = "".join(f"  {section}: {{{', '.join(items)}}}\n" for section, items in sections.items())
    return sched_yaml + ("" if sched_yaml.endswith("\n") or not sched_yaml else "\n") + "traffic:\n" + body


def start_replicas(logdir: Path, procs: list[Proc], ports: list[int], policy: Policy,
                   sched_yaml: str | None, kv_events_base: int | None = None,
                   extra_args: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """policy.replicas routers (each its own log dir), behind haproxy when more than one:
    (the URL clients send to, the routers' admin URLs)."""
    from loadtest import haproxy  # only the scale-out cells need it

    urls: list[str] = []
    admins: list[str] = []
    for i in range(policy.replicas):
        d = logdir / f"replica{i}" if policy.replicas > 1 else logdir
        d.mkdir(parents=True, exist_ok=True)
        url, admin = start_router(d, procs, ports, policy, sched_yaml, kv_events_base=kv_events_base,
                                  extra_args=extra_args)
        urls.append(url)
        admins.append(admin)
    if policy.replicas == 1:
        return urls[0], admins
    url = haproxy.start(logdir, procs, [int(u.rsplit(":", 1)[1]) for u in urls])
    return url, admins
