"""SGLang templates (Kthena has none; designed by analogy with its vLLM ones).

SGLang: one `leader` role; the engine is `python3 -m sglang.launch_server --model-path <cache>
--host 0.0.0.0 --port <port> --enable-metrics` plus the worker's `config` as flags. A server that
spans pods (`pods` > 1) runs SGLang's own multi-node mode instead of Ray: every pod starts the
same server with `--nnodes <pods> --node-rank <WORKER_INDEX> --dist-init-addr
$(ENTRY_ADDRESS):5000` (the ModelServing controller sets ENTRY_ADDRESS and WORKER_INDEX).

SGLang disaggregated: `prefill` and `decode` roles, `--disaggregation-mode prefill|decode`;
the prefill engine serves its bootstrap port (`--disaggregation-bootstrap-port`, 8998 unless
`config` sets it), which its pods announce to the router with the annotation
`router.kthena.io/bootstrap-port`. The KV transfer backend is SGLang's default (Mooncake)
unless `config` sets `disaggregation-transfer-backend`.
"""

from __future__ import annotations

from . import common as c
from .common import ConvertError, Images, Obj
from .vllm import drain_pre_stop

BOOTSTRAP_PORT = 8998
DIST_INIT_PORT = 5000
BOOTSTRAP_ANNOTATION = "router.kthena.io/bootstrap-port"
_OWN_FLAGS = ("model-path", "host", "port", "disaggregation-mode", "disaggregation-bootstrap-port", "nnodes",
              "node-rank", "dist-init-addr")


def bootstrap_port(worker: Obj) -> int:
    raw = c.config_of(worker).get("disaggregation-bootstrap-port")
    return BOOTSTRAP_PORT if raw is None else int(str(raw))


def command(backend: Obj, worker: Obj, rank: str | None = None, mode: str | None = None) -> list[str]:
    """`rank`: the node rank of a multi-pod server (None: one pod)."""
    config = c.config_of(worker)
    port = c.engine_port(backend)
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", c.model_path(backend), "--host", "0.0.0.0",
           "--port", str(port)]
    if "enable-metrics" not in config:
        cmd.append("--enable-metrics")  # /metrics for the runtime sidecar, the router and the preStop drain
    if mode is not None:
        cmd += ["--disaggregation-mode", mode]
        if mode == "prefill":
            cmd += ["--disaggregation-bootstrap-port", str(bootstrap_port(worker))]
    if rank is not None:
        cmd += ["--nnodes", str(int(worker.get("pods") or 0)), "--node-rank", rank,
                "--dist-init-addr", f"$(ENTRY_ADDRESS):{DIST_INIT_PORT}"]
    return cmd + c.engine_args({k: v for k, v in config.items() if k.replace("_", "-") not in _OWN_FLAGS})


def _engine(backend: Obj, worker: Obj, name: str, cmd: list[str], env: list[Obj], port: int) -> Obj:
    return {"name": name, "image": worker.get("image", ""), "ports": [{"containerPort": port}], "command": cmd,
            "env": env, "resources": worker.get("resources") or {}, "volumeMounts": [c.cache_mount(backend),
                                                                                      {"name": "dshm",
                                                                                       "mountPath": "/dev/shm"}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "initialDelaySeconds": 30,
                               "periodSeconds": 5, "failureThreshold": 3},
            "lifecycle": {"preStop": drain_pre_stop(port, "sglang:num_running_reqs", "sglang:num_queue_reqs")}}


def _volumes(backend: Obj) -> list[Obj]:
    return [c.cache_volume(backend), {"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def _wrap(booster: Obj, roles: list[Obj], rev_meta: Obj) -> Obj:
    backend = booster["spec"]["backend"]
    spec: Obj = {}
    if backend.get("schedulerName"):
        spec["schedulerName"] = backend["schedulerName"]
    spec["replicas"] = int(backend.get("replicas") or 0)
    spec["template"] = {"restartGracePeriodSeconds": 60,
                        "gangPolicy": {"minRoleReplicas": {r["name"]: r["replicas"] for r in roles}}, "roles": roles}
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing", "metadata": rev_meta,
            "spec": spec}


def serving(booster: Obj, images: Images, rev: str) -> Obj:
    backend = booster["spec"]["backend"]
    server = c.workers_by_type(backend).get("server")
    if server is None:
        raise ConvertError("spec.backend.workers", f"server worker not found in backend {backend['name']}")
    meta = c.serving_meta(booster, rev)
    port = c.engine_port(backend)
    env = c.engine_env(backend, [])
    pods = int(server.get("pods") or 0)
    multi = pods > 1
    engine = _engine(backend, server, "engine", command(backend, server, "0" if multi else None), env, port)
    runtime = c.runtime_container(booster, images, "sglang", port, env, env_from=True)
    init = [c.downloader(booster, images)]
    role: Obj = {
        "name": "leader", "replicas": int(server.get("replicas") or 0),
        "entryTemplate": {"metadata": {"labels": dict(meta["labels"])},
                          "spec": c.pod_spec(booster, server, initContainers=init, terminationGracePeriodSeconds=300,
                                             volumes=_volumes(backend), containers=[runtime, engine])},
        "workerReplicas": max(0, pods - 1),
    }
    if multi:  # the other ranks: the same server, node rank from WORKER_INDEX
        worker = _engine(backend, server, f"{backend['name'].lower()}-sglang-worker",
                         command(backend, server, "$(WORKER_INDEX)"), env, port)
        del worker["readinessProbe"], worker["lifecycle"]  # only rank 0 serves HTTP
        role["workerTemplate"] = {"metadata": {"labels": dict(meta["labels"])},
                                  "spec": c.pod_spec(booster, server, initContainers=init, volumes=_volumes(backend),
                                                     containers=[worker])}
    return _wrap(booster, [role], meta)


def disaggregated(booster: Obj, images: Images, rev: str) -> Obj:
    backend = booster["spec"]["backend"]
    workers = c.workers_by_type(backend)
    for kind in ("prefill", "decode"):
        if kind not in workers:
            raise ConvertError("spec.backend.workers", f"{kind} worker not found in backend {backend['name']}")
    meta = c.serving_meta(booster, rev)
    port = c.engine_port(backend)
    roles = []
    for kind in ("prefill", "decode"):
        w = workers[kind]
        env = c.engine_env(backend, [], c.pod_ip_env("POD_IP"))
        engine = _engine(backend, w, "sglang", command(backend, w, None, kind), env, port)
        runtime = c.runtime_container(booster, images, "sglang", port, env, env_from=True)
        tmeta: Obj = {"labels": dict(meta["labels"])}
        if kind == "prefill":
            engine["ports"].append({"containerPort": bootstrap_port(w), "name": "bootstrap"})
            tmeta["annotations"] = {BOOTSTRAP_ANNOTATION: str(bootstrap_port(w))}
        roles.append({"name": kind, "replicas": int(w.get("replicas") or 0),
                      "entryTemplate": {"metadata": tmeta,
                                        "spec": c.pod_spec(booster, w, initContainers=[c.downloader(booster, images)],
                                                           terminationGracePeriodSeconds=300,
                                                           volumes=_volumes(backend), containers=[runtime, engine])},
                      "workerReplicas": 0, "workerTemplate": {"spec": {"containers": []}}})
    return _wrap(booster, roles, meta)
