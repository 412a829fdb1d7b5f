"""The vLLM templates: one `leader` role (entry pod + Ray workers when a server spans pods),
and vLLM disaggregated (`prefill` and `decode` roles), as Kthena's templates/vllm.yaml and
templates/vllm-pd.yaml."""

from __future__ import annotations

import json

from . import common as c
from .common import ConvertError, Images, Obj

MULTI_NODE_SCRIPT = "examples/online_serving/multi-node-serving.sh"

_PRE_STOP = """while true; do
  METRICS=$(curl -s --max-time 2 http://localhost:{port}/metrics)
  RUNNING=$(echo "$METRICS" | grep '{running}' | grep -v '#' | awk '{{print $2}}' || true)
  WAITING=$(echo "$METRICS" | grep '{waiting}' | grep -v '#' | awk '{{print $2}}' || true)
  if [ -z "$RUNNING" ]; then
    echo "Terminating: Metrics endpoint unavailable, exiting preStop" >> /proc/1/fd/1
    exit 0
  fi
  if [ "$RUNNING" = "0.0" ] && [ "$WAITING" = "0.0" ]; then
    echo "Terminating: No active or waiting requests, safe to terminate" >> /proc/1/fd/1
    exit 0
  else
    echo "Terminating: Running: $RUNNING, Waiting: $WAITING" >> /proc/1/fd/1
    sleep 5
  fi
done
"""


def drain_pre_stop(port: int, running: str, waiting: str) -> Obj:
    """Wait in preStop until the engine has no running or waiting request (Kthena's script)."""
    return {"exec": {"command": ["/bin/sh", "-c", _PRE_STOP.format(port=port, running=running, waiting=waiting)]}}


def kv_connector_name(config: Obj) -> str:
    raw = config.get("kv-transfer-config")
    if not isinstance(raw, str):
        return ""
    try:
        v = json.loads(raw)
    except ValueError:
        return ""
    return str(v.get("kv_connector") or "") if isinstance(v, dict) else ""


def command(backend: Obj, worker: Obj, workers: dict[str, Obj]) -> list[str]:
    config = c.config_of(worker)
    cmd = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", c.model_path(backend),
           *c.engine_args(config)]
    server = workers.get("server")
    if server is not None and int(server.get("pods") or 0) > 1:
        cmd += ["--distributed_executor_backend", "ray"]
        cmd = ["bash", "-c", f"chmod u+x {MULTI_NODE_SCRIPT} && {MULTI_NODE_SCRIPT} leader "
                             f"--ray_cluster_size={int(server['pods'])} --num-gpus={c.device_count(server)} && "
                             + c.shell_join(cmd)]
    # the vLLM image lacks the Mooncake and NIXL packages: installed at start on GPU pods
    conn = kv_connector_name(config)
    if c.has_gpu(workers) and not c.env_bool(backend, "KTHENA_SKIP_ENGINE_DEPENDENCY_INSTALL"):
        tail = cmd[2] if cmd[0] == "bash" else c.shell_join(cmd)
        if conn == "MooncakeConnector":
            cmd = ["bash", "-c", "pip install mooncake-transfer-engine && " + tail]
        elif conn == "NixlConnector":
            cmd = ["bash", "-c", "PIP_DISABLE_PIP_VERSION_CHECK=1 pip install -U --no-cache-dir nixl && " + tail]
    return cmd


def _server(booster: Obj, images: Images, rev_labels: dict[str, str]) -> Obj:
    backend = booster["spec"]["backend"]
    workers = c.workers_by_type(backend)
    server = workers.get("server")
    if server is None:
        raise ConvertError("spec.backend.workers", f"server worker not found in backend {backend['name']}")
    port = c.engine_port(backend)
    env = c.engine_env(backend, [{"name": "VLLM_USE_V1", "value": "1"}])
    volumes = [c.cache_volume(backend), {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts = [c.cache_mount(backend), {"name": "dshm", "mountPath": "/dev/shm"}]
    init = [c.downloader(booster, images)]
    resources = server.get("resources") or {}
    replicas = int(server.get("replicas") or 0)
    pods = int(server.get("pods") or 0)
    engine = {
        "name": "engine", "image": server.get("image", ""), "command": command(backend, server, workers),
        "env": env, "resources": resources, "volumeMounts": mounts,
        "readinessProbe": {"failureThreshold": 3, "httpGet": {"path": "/health", "port": port, "scheme": "HTTP"},
                           "initialDelaySeconds": 180, "periodSeconds": 5, "successThreshold": 1,
                           "timeoutSeconds": 1},
        "lifecycle": {"preStop": drain_pre_stop(port, "vllm:num_requests_running", "vllm:num_requests_waiting")},
    }
    runtime = c.runtime_container(booster, images, "vllm", port, env, env_from=True)
    runtime["readinessProbe"] = {"httpGet": {"path": "/health", "port": runtime["ports"][0]["containerPort"]},
                                 "initialDelaySeconds": 5, "periodSeconds": 10}
    worker = {
        "name": f"{backend['name'].lower()}-vllm-worker", "image": server.get("image", ""),
        "command": ["bash", "-c", f"chmod u+x {MULTI_NODE_SCRIPT} && {MULTI_NODE_SCRIPT} worker "
                                  "--ray_address=$(ENTRY_ADDRESS)"],
        "resources": resources, "volumeMounts": mounts,
    }
    if backend.get("env"):
        worker["env"] = backend["env"]
    return {
        "name": "leader", "replicas": replicas,
        "entryTemplate": {"metadata": {"labels": dict(rev_labels)},
                          "spec": c.pod_spec(booster, server, initContainers=init, terminationGracePeriodSeconds=300,
                                             volumes=volumes, containers=[runtime, engine])},
        # Pods is the number of pods of one server (entry + Ray workers); 0 or 1: the entry alone
        "workerReplicas": max(0, pods - 1),
        "workerTemplate": {"metadata": {"labels": dict(rev_labels)},
                           "spec": c.pod_spec(booster, server, volumes=volumes, initContainers=init,
                                              containers=[worker])},
    }


def serving(booster: Obj, images: Images, rev: str) -> Obj:
    backend = booster["spec"]["backend"]
    meta = c.serving_meta(booster, rev)
    role = _server(booster, images, meta["labels"])
    spec: Obj = {}
    if backend.get("schedulerName"):
        spec["schedulerName"] = backend["schedulerName"]
    spec["replicas"] = int(backend.get("replicas") or 0)
    spec["template"] = {"restartGracePeriodSeconds": 60, "gangPolicy": {"minRoleReplicas": {"leader": role["replicas"]}},
                        "roles": [role]}
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing", "metadata": meta,
            "spec": spec}


def _pd_role(booster: Obj, images: Images, rev_labels: dict[str, str], kind: str, env: list[Obj]) -> Obj:
    backend = booster["spec"]["backend"]
    workers = c.workers_by_type(backend)
    w = workers[kind]
    port = c.engine_port(backend)
    probe = {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5, "failureThreshold": 3}
    engine = {"name": "vllm", "image": w.get("image", ""), "ports": [{"containerPort": port}], "env": env,
              "command": command(backend, w, workers), "imagePullPolicy": "IfNotPresent",
              "resources": w.get("resources") or {},
              "readinessProbe": {**probe, "initialDelaySeconds": 5},
              "livenessProbe": {**probe, "initialDelaySeconds": 180},
              "volumeMounts": [c.cache_mount(backend)]}
    # Kthena's template gives the decode runtime the backend's envFrom, not the prefill one
    runtime = c.runtime_container(booster, images, "vllmdisaggregated", port, env, env_from=kind == "decode")
    replicas = int(w.get("replicas") or 0)
    return {"name": kind, "replicas": replicas,
            "entryTemplate": {"metadata": {"labels": dict(rev_labels)},
                              "spec": c.pod_spec(booster, w, initContainers=[c.downloader(booster, images)],
                                                 containers=[runtime, engine], volumes=[c.cache_volume(backend)])},
            "workerReplicas": 0, "workerTemplate": {"spec": {"containers": []}}}


def disaggregated(booster: Obj, images: Images, rev: str) -> Obj:
    backend = booster["spec"]["backend"]
    workers = c.workers_by_type(backend)
    for kind in ("prefill", "decode"):
        if kind not in workers:
            raise ConvertError("spec.backend.workers", f"{kind} worker not found in backend {backend['name']}")
    meta = c.serving_meta(booster, rev)
    vllm = [{"name": "VLLM_USE_V1", "value": "1"}]
    hf_offline = {"name": "HF_HUB_OFFLINE", "value": "1"}
    prefill_env = c.engine_env(backend, vllm, hf_offline, c.pod_ip_env("HCCL_IF_IP"))
    decode_env = c.engine_env(backend, vllm, hf_offline, *({"name": n, "value": "eth0"} for n in
                                                           ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                                                            "HCCL_SOCKET_IFNAME")))
    roles = [_pd_role(booster, images, meta["labels"], "prefill", prefill_env),
             _pd_role(booster, images, meta["labels"], "decode", decode_env)]
    spec: Obj = {}
    if backend.get("schedulerName"):
        spec["schedulerName"] = backend["schedulerName"]
    spec["replicas"] = int(backend.get("replicas") or 0)
    spec["template"] = {"restartGracePeriodSeconds": 60,
                        "gangPolicy": {"minRoleReplicas": {r["name"]: r["replicas"] for r in roles}}, "roles": roles}
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing", "metadata": meta,
            "spec": spec}
