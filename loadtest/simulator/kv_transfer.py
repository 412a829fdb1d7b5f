"""Prefill/decode disaggregation: the shared parts (settings, KV transfer time, counters).

A simulated engine has a role: `both` (aggregated, no KV connector: PD fields in requests
are ignored, as by an engine started without one), `prefill` or `decode` (a connector is
configured). The wire protocols live in pd_nixl.py (vLLM's NixlConnector
`kv_transfer_params`) and pd_bootstrap.py (SGLang's bootstrap rooms); pd.py ties them to
the HTTP server. docs/pd-simulator.md has the figures and their sources.

Transfer time = KV bytes / bandwidth, in simulated seconds (scaled by --time-scale like
every engine step). KV bytes = whole blocks (a partial last block travels whole, as
connectors move blocks) x block_size x KV bytes per token of the calibrated model
(2 (K and V) x layers x KV heads x head dim x 2 bytes of bf16 = 131,072 B for the
Llama-3-8B shape). Default bandwidth: 400 Gb/s, one ConnectX-7 / NDR InfiniBand port per
GPU as on HGX H200 nodes (RDMA-class; NIXL and Mooncake move KV over it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .cost_model import DEFAULT_CALIBRATION


ROLES = ("both", "prefill", "decode")
DEFAULT_BANDWIDTH_GBPS = 400.0
KV_DTYPE_BYTES = 2  # bf16, the calibration's dtype
# Upstream defaults (documented in docs/pd-simulator.md):
VLLM_NIXL_ABORT_REQUEST_TIMEOUT_S = 480.0  # vLLM: unread prefill KV freed after this
SGLANG_BOOTSTRAP_TIMEOUT_S = 300.0  # SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (prefill side)
SGLANG_WAITING_TIMEOUT_S = 300.0  # SGLANG_DISAGGREGATION_WAITING_TIMEOUT (decode side)
CONNECT_TIMEOUT_S = 5.0  # decode -> prefill side channel / bootstrap server


def kv_bytes_per_token(calibration_path: str | None = None) -> int:
    """KV bytes per token of the calibrated model, from its `config` block."""
    with open(calibration_path or DEFAULT_CALIBRATION, encoding="utf-8") as f:
        cfg = json.load(f)["config"]
    return 2 * int(cfg["layers"]) * int(cfg["kv"]) * int(cfg["hd"]) * KV_DTYPE_BYTES


@dataclass(frozen=True)
class TransferModel:
    bytes_per_token: int
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS
    block_size: int = 16

    def kv_bytes(self, num_tokens: int) -> int:
        blocks = -(-num_tokens // self.block_size)
        return blocks * self.block_size * self.bytes_per_token

    def seconds(self, num_bytes: int) -> float:
        """Simulated seconds to move num_bytes at the link rate (Gb/s = 1e9 bits/s)."""
        return num_bytes * 8 / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class PdSettings:
    """One engine's PD settings (from the CLI)."""

    role: str = "both"
    flavour: str = "vllm"
    host: str = "127.0.0.1"
    side_port: int = 0  # vLLM: NIXL side channel; SGLang: bootstrap server (prefill only)
    transfer: TransferModel = field(default_factory=lambda: TransferModel(131072))
    hold_timeout_s: float | None = None  # None: the flavour's upstream default
    wait_timeout_s: float = SGLANG_WAITING_TIMEOUT_S
    load_failure_policy: str = "fail"  # vLLM kv_load_failure_policy: fail | recompute
    time_scale: float = 1.0

    @property
    def hold_timeout(self) -> float:
        if self.hold_timeout_s is not None:
            return self.hold_timeout_s
        return VLLM_NIXL_ABORT_REQUEST_TIMEOUT_S if self.flavour == "vllm" \
            else SGLANG_BOOTSTRAP_TIMEOUT_S

    def wall(self, simulated_s: float) -> float:
        return simulated_s * self.time_scale


@dataclass
class PdCounters:
    """Per-engine PD accounting (admin API `state()["pd"]`)."""

    prefill_requests: int = 0  # prefill hops served (KV kept for a decode engine)
    kv_held: int = 0  # prefill KV now waiting for its decode
    kv_sent: int = 0  # prefill KV read by a decode engine
    kv_sent_bytes: int = 0
    kv_expired: int = 0  # prefill KV freed unread after the hold timeout
    remote_prefill_decodes: int = 0  # decode hops that got their prompt's KV remotely
    kv_received_bytes: int = 0
    kv_transfer_seconds: float = 0.0  # simulated, transfer only
    kv_wait_seconds: float = 0.0  # simulated, decode side: request arrival -> KV in place
    kv_load_failures: int = 0
    kv_recomputed: int = 0  # load failures recomputed locally (policy recompute)
    aborted_prefill: int = 0  # client went away during a prefill hop
    aborted_decode: int = 0  # ... during a decode hop (waiting for KV or decoding)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


class KvLoadError(Exception):
    """The decode side could not get the prompt's KV (the fetch failed)."""

    def __init__(self, reason: str, room: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.room = room
