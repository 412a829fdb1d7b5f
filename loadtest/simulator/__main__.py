"""`python -m loadtest.simulator`: K simulated engines (one port each) + one admin port.

Prints one JSON line `{"ready": true, "ports": [...], "admin_port": N}` on stdout once
every port listens (port 0 picks a free port; the line gives the real ones). SIGTERM
or SIGINT stops everything and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
from typing import Any

import orjson
import uvloop
from aiohttp import web

from .admin import make_admin_app
from .fast_engine import FastEngine
from .faults import FaultError, parse_fault_spec
from .kv_transfer import (DEFAULT_BANDWIDTH_GBPS, ROLES, SGLANG_WAITING_TIMEOUT_S, PdSettings,
                          TransferModel, kv_bytes_per_token)
from .pd import PdEngine
from .server import EngineServer, ServerConfig
from .tokenizer import load_codec

log = logging.getLogger("loadtest.simulator")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.simulator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ports", default=None,
                   help="comma-separated, one per engine (0 = any free port); "
                        "default 8001, 8002, ...")
    p.add_argument("--admin-port", type=int, default=8100)
    p.add_argument("--model", default="demo")
    p.add_argument("--flavour", "--flavor", choices=("vllm", "sglang"), default="vllm")
    p.add_argument("--fast", action="store_true", help="fixed tiny latencies, no KV physics")
    p.add_argument("--fast-ttft-ms", type=float, default=0.2)
    p.add_argument("--fast-itl-ms", type=float, default=0.05)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--kv-blocks", type=int, default=None, help="KV blocks per DP rank")
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--lora", action="extend", nargs="+", default=[], metavar="NAME",
                   help="LoRA adapters loaded at start")
    # vLLM's split: --max-loras adapters per batch (GPU slots), --max-cpu-loras registered
    p.add_argument("--max-cpu-loras", type=int, default=None,
                   help="adapters registered per engine (default: --max-loras)")
    p.add_argument("--lora-load-ms", type=float, default=0.0,
                   help="simulated ms to load an adapter into a free GPU slot")
    p.add_argument("--dp-ranks", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibration", default=None, help="calibration JSON (default: shipped)")
    p.add_argument("--faults", default=None,
                   help='JSON: {"0": {...}} per engine index, {"*": {...}} for all')
    p.add_argument("--kv-events-port-base", type=int, default=None,
                   help="publish vLLM KV events (ZMQ): engine i, DP rank r on base+2*(i*dp+r); "
                        "replay on that port +1 (physics engines only)")
    p.add_argument("--kv-events-hash-seed", default="0", help="vLLM's PYTHONHASHSEED for block hashes")
    p.add_argument("--kv-events-encoding", choices=("map", "array"), default="map",
                   help="event encoding: tagged maps (current vLLM) or tagged arrays (older vLLM)")
    pd = p.add_argument_group("prefill/decode disaggregation (docs/pd-simulator.md)")
    pd.add_argument("--roles", default=None,
                    help="comma-separated, one per engine: both (aggregated, default), prefill "
                         "or decode (a KV connector: vLLM NIXL kv_transfer_params, SGLang "
                         "bootstrap rooms)")
    pd.add_argument("--kv-ports", default=None,
                    help="comma-separated, one per engine: the NIXL side channel (vLLM, "
                         "prefill and decode) or bootstrap server (SGLang prefill) port; "
                         "0 = any free port (default; real engines use 5600 and 8998)")
    pd.add_argument("--kv-bandwidth-gbps", type=float, default=DEFAULT_BANDWIDTH_GBPS,
                    help="KV transfer link rate, Gb/s (default 400: one NDR/CX-7 port per GPU)")
    pd.add_argument("--kv-hold-timeout-s", type=float, default=None,
                    help="prefill KV kept for its decode at most this long (simulated s); "
                         "default vLLM 480 (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), SGLang 300 "
                         "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)")
    pd.add_argument("--kv-wait-timeout-s", type=float, default=SGLANG_WAITING_TIMEOUT_S,
                    help="a decode waits for its KV at most this long (simulated s; "
                         "SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300)")
    pd.add_argument("--kv-load-failure-policy", choices=("fail", "recompute"), default="fail",
                    help="vLLM's kv_load_failure_policy: fail the request (default) or "
                         "prefill the prompt locally")
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    if a.engines < 1 or a.dp_ranks < 1:
        p.error("--engines and --dp-ranks must be at least 1")
    if a.ports is None:
        a.port_list = [8001 + i for i in range(a.engines)]
    else:
        try:
            a.port_list = [int(x) for x in a.ports.split(",") if x.strip()]
        except ValueError:
            p.error("--ports must be comma-separated integers")
        if len(a.port_list) != a.engines:
            p.error(f"--ports lists {len(a.port_list)} ports for {a.engines} engines")
    a.role_list = _per_engine(p, a.roles, "--roles", a.engines, "both", str)
    a.kv_port_list = _per_engine(p, a.kv_ports, "--kv-ports", a.engines, 0, int)
    if any(r not in ROLES for r in a.role_list):
        p.error(f"--roles: each must be one of {', '.join(ROLES)}")
    if a.kv_bandwidth_gbps <= 0 or a.kv_wait_timeout_s <= 0 or (
            a.kv_hold_timeout_s is not None and a.kv_hold_timeout_s <= 0):
        p.error("--kv-bandwidth-gbps and the --kv-*-timeout-s must be > 0")
    if a.kv_load_failure_policy == "recompute" and a.flavour == "sglang":
        p.error("--kv-load-failure-policy recompute is vLLM's; SGLang fails the request")
    limit, flag = ((a.max_loras, "--max-loras") if a.max_cpu_loras is None
                   else (a.max_cpu_loras, "--max-cpu-loras"))
    if len(a.lora) > limit:
        p.error(f"{len(a.lora)} --lora adapters exceed {flag} {limit}")
    if a.max_cpu_loras is not None and a.max_cpu_loras < a.max_loras:
        p.error("--max-cpu-loras must be >= --max-loras")
    try:
        a.fault_list = parse_fault_spec(orjson.loads(a.faults) if a.faults else {}, a.engines)
    except (orjson.JSONDecodeError, FaultError) as e:
        p.error(f"--faults: {e}")
    return a


def _per_engine(p: argparse.ArgumentParser, raw: str | None, flag: str, n: int, default: Any,
                conv: Any) -> list[Any]:
    if raw is None:
        return [default] * n
    try:
        vals = [conv(x.strip()) for x in raw.split(",")]
    except ValueError:
        p.error(f"{flag} must be a comma-separated list")
    if len(vals) != n:
        p.error(f"{flag} lists {len(vals)} values for {n} engines")
    return vals


def make_pd(a: argparse.Namespace, index: int) -> PdEngine | None:
    role = a.role_list[index]
    if role == "both":
        return None
    transfer = TransferModel(kv_bytes_per_token(a.calibration), a.kv_bandwidth_gbps, a.block_size)
    return PdEngine(PdSettings(
        role=role, flavour=a.flavour, host=a.host, side_port=a.kv_port_list[index],
        transfer=transfer, hold_timeout_s=a.kv_hold_timeout_s, wait_timeout_s=a.kv_wait_timeout_s,
        load_failure_policy=a.kv_load_failure_policy, time_scale=a.time_scale), index)


def make_engines(a: argparse.Namespace, index: int, codec) -> list[Any]:
    if a.fast:
        return [FastEngine(a, ttft_s=a.fast_ttft_ms / 1000, itl_s=a.fast_itl_ms / 1000,
                           output_ids=list(range(len(codec.output_ids)))) for _ in range(a.dp_ranks)]
    from .engine import Engine, EngineConfig  # physics only when asked for

    wanted = dict(model=a.model, block_size=a.block_size, max_num_seqs=a.max_num_seqs,
                  max_num_batched_tokens=a.max_num_batched_tokens, num_gpu_blocks=a.kv_blocks,
                  max_model_len=a.max_model_len, time_scale=a.time_scale,
                  calibration_path=a.calibration, max_loras=a.max_loras,
                  lora_load_s=a.lora_load_ms / 1000.0)
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    engines = []
    for rank in range(a.dp_ranks):
        cfg = EngineConfig(**{k: v for k, v in wanted.items() if k in known},
                           seed=a.seed * 1_000_003 + index * 101 + rank)
        engines.append(Engine(cfg))
    return engines


async def run(a: argparse.Namespace) -> None:
    codec = load_codec()
    servers = []
    for i, port in enumerate(a.port_list):
        cfg = ServerConfig(index=i, host=a.host, port=port, model=a.model, flavour=a.flavour,
                           max_loras=a.max_loras, max_cpu_loras=a.max_cpu_loras,
                           loras=list(a.lora),
                           max_model_len=a.max_model_len, block_size=a.block_size,
                           max_num_seqs=a.max_num_seqs,
                           max_num_batched_tokens=a.max_num_batched_tokens, seed=a.seed,
                           fast=a.fast)
        servers.append(EngineServer(cfg, make_engines(a, i, codec), codec, a.fault_list[i],
                                    make_pd(a, i)))
    publishers: list[list[Any]] = [[] for _ in servers]
    admin = web.AppRunner(make_admin_app(servers, publishers), access_log=None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if a.kv_events_port_base is not None and not a.fast:
            await start_publishers(a, servers, publishers)  # before any request: caches empty
        for s in servers:
            await s.start()
            if s.faults.refuse_connections:
                await s.set_refusing(True)
        await admin.setup()
        site = web.TCPSite(admin, a.host, a.admin_port, reuse_address=True)
        await site.start()
        admin_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready: dict[str, Any] = {"ready": True, "ports": [s.cfg.port for s in servers],
                                 "admin_port": admin_port,
                                 "kv_ports": [s.pd.port if s.pd else None for s in servers]}
        if a.kv_events_port_base is not None:
            ready["kv_events"] = [[[p.pub_address, p.replay_address] for p in ps] for ps in publishers]
        print(orjson.dumps(ready).decode(), flush=True)
        await stop.wait()
    finally:
        await admin.cleanup()
        for s in servers:
            await s.stop()
        for ps in publishers:
            for pub in ps:
                await pub.close()


async def start_publishers(a: argparse.Namespace, servers: list[EngineServer],
                           publishers: list[list[Any]]) -> None:
    from .kv_events import KvEventPublisher, VllmBlockHasher, kv_events_ports

    hasher = VllmBlockHasher("sha256_cbor", a.kv_events_hash_seed)
    for i, s in enumerate(servers):
        for r, eng in enumerate(s.engines):
            pub_port, replay_port = kv_events_ports(a.kv_events_port_base, i, r, a.dp_ranks)
            pub = KvEventPublisher(eng.kv, host=a.host, port=pub_port, replay_port=replay_port,
                                   hasher=hasher, encoding=a.kv_events_encoding, data_parallel_rank=r)
            await pub.start()
            publishers[i].append(pub)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        uvloop.run(run(a))
    except OSError as e:  # e.g. a port in use: say so without a traceback
        print(f"simulator: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
