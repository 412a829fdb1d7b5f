"""The autoscaler benchmark's simulated cluster, without Kubernetes.

- A pool of engines, all started up front: one simulator process per potential replica,
  each on its own loopback address (127.0.0.<base+i>) and the same port, as pods are.
- The router in file mode: one ModelRoute, one ModelServer, an Endpoints document listing
  the *active* replicas; a change is written atomically and applied with /admin/reload.
- `ReplicaPool`: the ModelServing's replica count. A scale-up makes a replica "starting"
  (it counts at once: requested, billed) and "active" (in the router's config, its pod
  Ready) after the startup delay; a scale-down removes the newest replicas first
  (starting ones before active ones). Replica-seconds run from the request to the removal.
  `pods()` fabricates the pods the autoscaler's collector reads (targets.metric_pods).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller import naming as n
from loadtest.procs import HOST, Proc, StartError, free_ports, http, wait_until

NAMESPACE = "default"
MS_NAME = "llm"
MODEL = "demo"


@dataclass
class Replica:
    index: int
    ip: str
    state: str = "off"  # off | starting | active
    requested_at: float = 0.0  # simulated seconds
    ready_at: float = 0.0
    removed_at: float = -1.0  # last removal (a re-used engine is picked least recently used)


@dataclass
class ReplicaPool:
    ips: list[str]
    startup_s: float  # simulated seconds from request to Ready
    replicas: list[Replica] = field(init=False)
    intervals: list[tuple[float, float]] = field(default_factory=list)  # closed (requested, removed)
    order: list[int] = field(default_factory=list)  # indices of live replicas, oldest first

    def __post_init__(self) -> None:
        self.replicas = [Replica(i, ip) for i, ip in enumerate(self.ips)]

    @property
    def current(self) -> int:
        return len(self.order)

    def active_ips(self) -> list[str]:
        return [self.replicas[i].ip for i in self.order if self.replicas[i].state == "active"]

    def start(self, count: int, now: float) -> None:
        """The initial replicas, active at once (the trace starts with a warm cluster)."""
        for r in self.replicas[:count]:
            r.state, r.requested_at, r.ready_at = "active", now, now
            self.order.append(r.index)

    def scale_to(self, target: int, now: float) -> bool:
        """Apply a replica count; True when the active set changed."""
        target = max(0, min(target, len(self.replicas)))
        changed = False
        while self.current < target:
            free = [r for r in self.replicas if r.state == "off"]
            r = min(free, key=lambda x: (x.removed_at, x.index))
            r.state, r.requested_at, r.ready_at = "starting", now, now + self.startup_s
            self.order.append(r.index)
        while self.current > target:
            starting = [i for i in self.order if self.replicas[i].state == "starting"]
            idx = starting[-1] if starting else self.order[-1]
            r = self.replicas[idx]
            changed |= r.state == "active"
            self.intervals.append((r.requested_at, now))
            r.state, r.removed_at = "off", now
            self.order.remove(idx)
        return changed

    def tick(self, now: float) -> bool:
        """Starting replicas whose delay has passed become active; True if any did."""
        changed = False
        for i in self.order:
            r = self.replicas[i]
            if r.state == "starting" and now >= r.ready_at:
                r.state, changed = "active", True
        return changed

    def replica_seconds(self, until: float) -> float:
        """Simulated replica-seconds within [0, until] (live replicas counted until `until`)."""
        spans = [*self.intervals, *((self.replicas[i].requested_at, until) for i in self.order)]
        return sum(max(0.0, min(b, until) - min(a, until)) for a, b in spans)

    def pods(self) -> list[dict[str, Any]]:
        """The target's pods as the collector reads them (entry pods; Ready once active)."""
        out = []
        for i in self.order:
            r = self.replicas[i]
            ready = r.state == "active"
            out.append({
                "metadata": {"name": f"{MS_NAME}-{r.index}-0", "namespace": NAMESPACE,
                             "labels": {n.LABEL_NAME: MS_NAME, n.LABEL_ENTRY: n.ENTRY}},
                "status": {"phase": "Running" if ready else "Pending", "podIP": r.ip if ready else "",
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            })
        return out


def engine_ips(count: int, base: int = 11) -> list[str]:
    return [f"127.0.0.{base + i}" for i in range(count)]


def start_engines(ips: list[str], port: int, sim_args: list[str], logdir: Path, procs: list[Proc],
                  timeout_s: float = 90.0) -> None:
    """One simulator process per address, all on `port`; waits for every ready line."""
    started = []
    for i, ip in enumerate(ips):
        admin = free_ports(1)[0]
        cmd = [sys.executable, "-m", "loadtest.simulator", "--engines", "1", "--host", ip, "--ports", str(port),
               "--admin-port", str(admin), "--model", MODEL, "--flavour", "vllm", "--seed", str(i + 1),
               "--log-level", "warning", *sim_args]
        p = Proc(f"engine-{i}", cmd, logdir)
        procs.append(p)
        started.append(p)
    for p in started:
        def ready(p: Proc = p) -> bool:
            return any(line.startswith("{") and json.loads(line).get("ready")
                       for line in p.out_path.read_text(errors="replace").splitlines())
        wait_until(ready, p, timeout_s, "ready line")


def router_docs(active_ips: list[str], port: int) -> str:
    eps = "\n".join(f"  - {{address: {ip}, port: {port}, labels: {{app: {MS_NAME}}}}}" for ip in active_ips)
    return f"""\
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: {MS_NAME}, namespace: {NAMESPACE}}}
spec:
  modelName: {MODEL}
  rules:
  - name: all
    targetModels:
    - modelServerName: {MS_NAME}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: {MS_NAME}, namespace: {NAMESPACE}}}
spec:
  model: {MODEL}
  inferenceEngine: vLLM
  workloadSelector:
    matchLabels: {{app: {MS_NAME}}}
  workloadPort: {{port: {port}, protocol: http}}
---
apiVersion: router.kthena.io/v1alpha1
kind: Endpoints
metadata: {{name: {MS_NAME}-engines, namespace: {NAMESPACE}}}
spec:
  endpoints:
{eps}
"""


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class RouterHandle:
    proc: Proc
    url: str
    admin_url: str
    config: Path
    port: int  # the engines' port

    def apply(self, active_ips: list[str]) -> None:
        """Write the active replicas as the Endpoints and reload (blocking; run in a thread)."""
        write_atomic(self.config, router_docs(active_ips, self.port))
        status, body = http("POST", f"{self.admin_url}/admin/reload?timeout=30", b"", timeout=60)
        if status != 200:
            raise StartError(f"router reload: HTTP {status}: {body[:300]!r}")


def start_router(logdir: Path, engine_port: int, active_ips: list[str], router_config: Path | None,
                 extra_args: list[str], procs: list[Proc], timeout_s: float = 60.0) -> RouterHandle:
    port, admin = free_ports(2)
    cfg = logdir / "routes.yaml"
    write_atomic(cfg, router_docs(active_ips, engine_port))
    cmd = [sys.executable, "-m", "kthena_router.cli", "--config", str(cfg), "--host", HOST, "--port", str(port),
           "--admin-host", HOST, "--admin-port", str(admin), "--workers", "1", "--log-level", "warning",
           "--runtime-dir", str(logdir / "router-runtime"), *extra_args]
    if router_config is not None:
        cmd += ["--router-config", str(router_config)]
    p = Proc("router", cmd, logdir)
    procs.append(p)
    admin_url = f"http://{HOST}:{admin}"
    wait_until(lambda: http("GET", f"{admin_url}/readyz")[0] == 200, p, timeout_s, "/readyz 200")
    return RouterHandle(p, f"http://{HOST}:{port}", admin_url, cfg, engine_port)
