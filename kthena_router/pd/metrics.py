"""Prefill/decode metrics (on the router's registry; multiprocess like the others).

Kthena's two phase histograms keep Kthena's names and labels (model, path, status_code), so
its dashboards work. Ours, kthena_router_pd_*, carry the ModelServer:

- requests_total{mode}: two_hop, or decode_only when the pairer skipped the prefill
  (conditional disaggregation): the share that skipped prefill is visible.
- kv_wait_seconds{connector}: the decode hop's time from sending the request to its first
  token event, streamed decode hops only. It is what the decode engine needs before it can
  sample: loading the KV (nixl/mooncake: the read from the prefill engine; bootstrap: waiting
  for the prefill and its push; http/lmcache: a full local prefill or an LMCache load) plus
  one step. The router cannot separate the transfer from that step; the step is small and
  near constant, so the histogram tracks the transfer. A non-streamed decode hop's headers
  come after the whole generation: not observed.
- decode_ttft_seconds{mode}: request arrival to the first byte sent to the client (both
  hops and any earlier failed pair included): the client's TTFT for PD requests.
- hop_failures_total{side, reason}: failed hops (reasons: health.Failure values, plus
  no_kv_params when a vLLM prefill reply carries no kv_transfer_params).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from kthena_router.metric_labels import LabelChildren
from kthena_router.metrics import DURATION_BUCKETS, TTFT_BUCKETS

__all__ = ["PdMetrics"]


class PdMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.prefill = Histogram(
            "kthena_router_request_prefill_duration_seconds",
            "Prefill hop latency of PD-disaggregated requests (send to the complete reply)",
            ["model", "path", "status_code"], buckets=DURATION_BUCKETS, registry=registry)
        self.decode = Histogram(
            "kthena_router_request_decode_duration_seconds",
            "Decode hop latency of PD-disaggregated requests (send to the end of the relayed reply)",
            ["model", "path", "status_code"], buckets=DURATION_BUCKETS, registry=registry)
        self.requests = Counter(
            "kthena_router_pd_requests_total",
            "PD requests by mode: two_hop (prefill then decode) or decode_only (prefill skipped)",
            ["model_server", "model", "mode"], registry=registry)
        self.kv_wait = Histogram(
            "kthena_router_pd_kv_wait_seconds",
            "Streamed decode hops: send to the first token event (KV load + one step)",
            ["model_server", "model", "connector"], buckets=TTFT_BUCKETS, registry=registry)
        self.decode_ttft = Histogram(
            "kthena_router_pd_decode_ttft_seconds",
            "PD requests: arrival to the first byte sent to the client (all hops included)",
            ["model_server", "model", "mode"], buckets=TTFT_BUCKETS, registry=registry)
        self.hop_failures = Counter(
            "kthena_router_pd_hop_failures_total", "Failed PD hops by side and reason",
            ["model_server", "side", "reason"], registry=registry)
        self._child = LabelChildren()

    def prefill_hop(self, model: str, path: str, status: str, seconds: float) -> None:
        self._child(self.prefill, model, path, status).observe(seconds)

    def decode_hop(self, model: str, path: str, status: str, seconds: float) -> None:
        self._child(self.decode, model, path, status).observe(seconds)

    def request(self, server: str, model: str, mode: str) -> None:
        self._child(self.requests, server, model, mode).inc()

    def observe_kv_wait(self, server: str, model: str, connector: str, seconds: float) -> None:
        self._child(self.kv_wait, server, model, connector).observe(seconds)

    def observe_ttft(self, server: str, model: str, mode: str, seconds: float) -> None:
        self._child(self.decode_ttft, server, model, mode).observe(seconds)

    def hop_failure(self, server: str, side: str, reason: str) -> None:
        self._child(self.hop_failures, server, side, reason).inc()
