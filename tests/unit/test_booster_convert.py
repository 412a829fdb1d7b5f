"""ModelBooster -> ModelServing / ModelServer / ModelRoute / AutoscalingPolicy (pure conversion),
golden expectations per template and per modelURI scheme, written after Kthena's testdata
(pkg/model-booster-controller/convert/testdata) with our deliberate differences (docs/booster.md)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from controller.booster import convert, desired, names
from controller.booster.common import ConvertError, Images

Obj = dict[str, Any]

LABELS = {"workload.serving.volcano.sh/model-name": "test-model",
          "workload.serving.volcano.sh/backend-name": "backend1",
          "workload.serving.volcano.sh/managed-by": "workload.serving.volcano.sh",
          "workload.serving.volcano.sh/model-uid": "randomUID"}
OWNER = [{"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelBooster", "name": "test-model",
          "uid": "randomUID", "controller": True, "blockOwnerDeletion": True}]
MD5_S3 = "13a7c4d58031cdc502ca1bb4a592f2b9"  # md5 of the s3:// modelURI below (as Kthena)
REDIS = [{"name": "REDIS_HOST", "valueFrom": {"configMapKeyRef": {"name": "redis-config", "key": "REDIS_HOST",
                                                                  "optional": True}}},
         {"name": "REDIS_PORT", "valueFrom": {"configMapKeyRef": {"name": "redis-config", "key": "REDIS_PORT",
                                                                  "optional": True}}},
         {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "redis-secret", "key": "REDIS_PASSWORD",
                                                                   "optional": True}}}]
POD = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
       {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]


def booster(btype: str = "vLLM", workers: list[Obj] | None = None, **backend: Any) -> Obj:
    """Kthena's testdata/input/model.yaml (server spanning 2 pods)."""
    b: Obj = {
        "name": "backend1", "type": btype,
        "modelURI": "s3://aios_models/deepseek-ai/DeepSeek-V3-W8A8/vllm-ascend", "cacheURI": "hostpath:///tmp/test",
        "replicas": 0,
        "env": [{"name": "ENDPOINT", "value": "https://obs.test.com"}, {"name": "RUNTIME_PORT", "value": "8900"}],
        "envFrom": [{"secretRef": {"name": "test-secret"}}],
        "workers": workers if workers is not None else [{
            "type": "server", "image": "vllm-server:latest", "pods": 2,
            "config": {"block-size": 128, "gpu-memory-utilization": 0.9, "max-model-len": 32768,
                       "tensor-parallel-size": 2, "trust-remote-code": "", "served-model-name": "deepseek-v3"},
            "resources": {"limits": {"cpu": "100m", "huawei.com/ascend-1980": "1", "memory": "1Gi"}}}],
    }
    b.update(backend)
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelBooster",
            "metadata": {"name": "test-model", "namespace": "default", "uid": "randomUID"},
            "spec": {"backend": b}}


def pd_booster(btype: str = "vLLMDisaggregated", kv: bool = True) -> Obj:
    def worker(kind: str, role: str, util: float, image: str) -> Obj:
        cfg: Obj = {"served-model-name": "ds-r1-qwen-7b-pd", "tensor-parallel-size": 16,
                    "gpu-memory-utilization": util, "trust-remote-code": ""}
        if kv:
            cfg["kv-transfer-config"] = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": role},
                                                   separators=(",", ":"))
        return {"type": kind, "image": image, "pods": 1, "replicas": 1, "config": cfg,
                "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    b = booster(btype, [worker("prefill", "kv_producer", 0.99, "pd:latest"),
                        worker("decode", "kv_consumer", 0.95, "pd:latest")],
                modelURI="s3://aios_models/deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", cacheURI="hostpath://cache",
                schedulerName="volcano", replicas=1, env=[{"name": "ENDPOINT", "value": "https://obs.test.com"}],
                envFrom=[{"secretRef": {"name": "downloader-secrets"}}])
    b["spec"]["name"] = "ds-r1-qwen-7b-pd"
    return b


def by_kind(objs: list[Obj]) -> dict[str, Obj]:
    return {o["kind"]: o for o in objs}


def downloader(source: str, out: str, mount: str, env: list[Obj] | None = None,
               env_from: list[Obj] | None = None) -> Obj:
    c: Obj = {"name": "test-model-model-downloader", "image": "kthena/downloader:latest",
              "args": ["--source", source, "--output-dir", out]}
    if env:
        c["env"] = env
    if env_from:
        c["envFrom"] = env_from
    c["volumeMounts"] = [{"name": "backend1-weights", "mountPath": mount}]
    return c


PRE_STOP_VLLM = (
    "while true; do\n"
    "  METRICS=$(curl -s --max-time 2 http://localhost:8000/metrics)\n"
    "  RUNNING=$(echo \"$METRICS\" | grep 'vllm:num_requests_running' | grep -v '#' | awk '{print $2}' || true)\n"
    "  WAITING=$(echo \"$METRICS\" | grep 'vllm:num_requests_waiting' | grep -v '#' | awk '{print $2}' || true)\n"
    "  if [ -z \"$RUNNING\" ]; then\n"
    "    echo \"Terminating: Metrics endpoint unavailable, exiting preStop\" >> /proc/1/fd/1\n"
    "    exit 0\n"
    "  fi\n"
    "  if [ \"$RUNNING\" = \"0.0\" ] && [ \"$WAITING\" = \"0.0\" ]; then\n"
    "    echo \"Terminating: No active or waiting requests, safe to terminate\" >> /proc/1/fd/1\n"
    "    exit 0\n"
    "  else\n"
    "    echo \"Terminating: Running: $RUNNING, Waiting: $WAITING\" >> /proc/1/fd/1\n"
    "    sleep 5\n"
    "  fi\n"
    "done\n")


# --- vLLM ----------------------------------------------------------------------------------------
def test_vllm_model_serving_golden() -> None:
    ms = by_kind(convert.build(booster()))["ModelServing"]
    rev = convert.serving_revision(booster()["spec"]["backend"])
    labels = {**LABELS, names.LABEL_REVISION: rev}
    env = [{"name": "ENDPOINT", "value": "https://obs.test.com"}, {"name": "RUNTIME_PORT", "value": "8900"}, *POD,
           {"name": "VLLM_USE_V1", "value": "1"}, *REDIS]
    volumes = [{"name": "backend1-weights", "hostPath": {"path": "/tmp/test", "type": "DirectoryOrCreate"}},
               {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts = [{"name": "backend1-weights", "mountPath": "/tmp/test"}, {"name": "dshm", "mountPath": "/dev/shm"}]
    init = [downloader("s3://aios_models/deepseek-ai/DeepSeek-V3-W8A8/vllm-ascend", f"/tmp/test/{MD5_S3}",
                       "/tmp/test", [{"name": "ENDPOINT", "value": "https://obs.test.com"}],
                       [{"secretRef": {"name": "test-secret"}}])]
    resources = {"limits": {"cpu": "100m", "huawei.com/ascend-1980": "1", "memory": "1Gi"}}
    script = "examples/online_serving/multi-node-serving.sh"
    assert ms == {
        "apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing",
        "metadata": {"name": "test-model-backend1", "namespace": "default", "labels": labels,
                     "ownerReferences": OWNER},
        "spec": {"replicas": 0, "template": {
            "restartGracePeriodSeconds": 60, "gangPolicy": {"minRoleReplicas": {"leader": 0}},
            "roles": [{
                "name": "leader", "replicas": 0,
                "entryTemplate": {"metadata": {"labels": labels}, "spec": {
                    "affinity": {}, "initContainers": init, "terminationGracePeriodSeconds": 300,
                    "volumes": volumes,
                    "containers": [
                        {"name": "runtime", "image": "kthena/runtime:latest", "ports": [{"containerPort": 8900}],
                         "env": env, "envFrom": [{"secretRef": {"name": "test-secret"}}],
                         "args": ["--port", "8900", "--engine", "vllm", "--engine-base-url", "http://localhost:8000",
                                  "--engine-metrics-path", "/metrics", "--pod", "$(POD_NAME).$(NAMESPACE)",
                                  "--model", "test-model"],
                         "readinessProbe": {"httpGet": {"path": "/health", "port": 8900}, "initialDelaySeconds": 5,
                                            "periodSeconds": 10}},
                        {"name": "engine", "image": "vllm-server:latest",
                         "command": ["bash", "-c",
                                     f"chmod u+x {script} && {script} leader --ray_cluster_size=2 --num-gpus=1 && "
                                     "python3 -m vllm.entrypoints.openai.api_server --model "
                                     f"/tmp/test/{MD5_S3} --block-size 128 --gpu-memory-utilization 0.9 "
                                     "--max-model-len 32768 --served-model-name deepseek-v3 "
                                     "--tensor-parallel-size 2 --trust-remote-code --distributed_executor_backend ray"],
                         "env": env, "resources": resources, "volumeMounts": mounts,
                         "readinessProbe": {"failureThreshold": 3, "httpGet": {"path": "/health", "port": 8000,
                                                                               "scheme": "HTTP"},
                                            "initialDelaySeconds": 180, "periodSeconds": 5, "successThreshold": 1,
                                            "timeoutSeconds": 1},
                         "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", PRE_STOP_VLLM]}}}},
                    ]}},
                "workerReplicas": 1,
                "workerTemplate": {"metadata": {"labels": labels}, "spec": {
                    "affinity": {}, "volumes": volumes, "initContainers": init,
                    "containers": [{"name": "backend1-vllm-worker", "image": "vllm-server:latest",
                                    "command": ["bash", "-c", f"chmod u+x {script} && {script} worker "
                                                              "--ray_address=$(ENTRY_ADDRESS)"],
                                    "resources": resources, "volumeMounts": mounts,
                                    "env": [{"name": "ENDPOINT", "value": "https://obs.test.com"},
                                            {"name": "RUNTIME_PORT", "value": "8900"}]}]}},
            }]}},
    }


def test_vllm_model_server_and_route_golden() -> None:
    objs = by_kind(convert.build(booster()))
    server, route = objs["ModelServer"], objs["ModelRoute"]
    assert server["metadata"]["name"] == "test-model-backend1"
    assert server["metadata"]["ownerReferences"] == OWNER
    assert {k: v for k, v in server["metadata"]["labels"].items() if k != names.LABEL_REVISION} == LABELS
    assert server["spec"] == {
        "model": "deepseek-v3", "inferenceEngine": "vLLM",
        "workloadSelector": {"matchLabels": {"workload.serving.volcano.sh/model-uid": "randomUID"}},
        "workloadPort": {"port": 8000}, "trafficPolicy": {"retry": {"attempts": 5, "retryInterval": "0s"}}}
    assert route["metadata"]["name"] == "test-model"
    assert route["metadata"]["labels"][names.LABEL_BACKEND_NAME] == ""
    assert route["spec"] == {"modelName": "test-model",
                             "rules": [{"name": "default", "targetModels": [{"modelServerName": "test-model-backend1"}]}]}
    assert sorted(objs) == ["ModelRoute", "ModelServer", "ModelServing"]  # no AutoscalingPolicy unless asked


def test_route_uses_spec_name_and_model_match() -> None:
    b = booster()
    b["spec"]["name"] = "deepseek"
    b["spec"]["modelMatch"] = {"headers": {"x-tier": {"exact": "gold"}}}
    route = by_kind(convert.build(b))["ModelRoute"]
    assert route["spec"] == {"modelName": "deepseek", "rules": [{
        "name": "default", "modelMatch": {"headers": {"x-tier": {"exact": "gold"}}},
        "targetModels": [{"modelServerName": "test-model-backend1"}]}]}


def test_single_pod_server_has_no_ray() -> None:
    b = booster()
    w = b["spec"]["backend"]["workers"][0]
    w.update(pods=1, replicas=3, config={"max-model-len": 4096, "enable_prefix_caching": True, "port": 9000},
             image="vllm/vllm-openai:v0.9")
    ms = by_kind(convert.build(b))["ModelServing"]
    role = ms["spec"]["template"]["roles"][0]
    engine = role["entryTemplate"]["spec"]["containers"][1]
    assert engine["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 f"/tmp/test/{MD5_S3}", "--enable-prefix-caching", "true", "--max-model-len", "4096",
                                 "--port", "9000"]
    assert engine["readinessProbe"]["httpGet"]["port"] == 9000
    assert role["replicas"] == 3 and role["workerReplicas"] == 0
    assert ms["spec"]["template"]["gangPolicy"] == {"minRoleReplicas": {"leader": 3}}
    server = by_kind(convert.build(b))["ModelServer"]
    assert server["spec"]["workloadPort"] == {"port": 9000}
    assert server["spec"]["model"] == "test-model"  # no served-model-name: the booster's name


def test_scheduler_runtime_class_affinity_tolerations() -> None:
    b = booster(schedulerName="volcano", runtimeClassName="nvidia")
    w = b["spec"]["backend"]["workers"][0]
    w["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    w["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}}}
    ms = by_kind(convert.build(b))["ModelServing"]
    assert ms["spec"]["schedulerName"] == "volcano"
    role = ms["spec"]["template"]["roles"][0]
    for t in ("entryTemplate", "workerTemplate"):
        spec = role[t]["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["tolerations"] == w["tolerations"] and spec["affinity"] == w["affinity"]


# --- modelURI schemes and caches -------------------------------------------------------------------
@pytest.mark.parametrize("model_uri,cache_uri,volume,mount", [
    ("hf://Qwen/Qwen2.5-0.5B-Instruct", "pvc://model-cache",
     {"persistentVolumeClaim": {"claimName": "model-cache"}}, "/model-cache"),
    ("ms://qwen/Qwen2.5-0.5B-Instruct", "hostpath:///var/models",
     {"hostPath": {"path": "/var/models", "type": "DirectoryOrCreate"}}, "/var/models"),
    ("s3://bucket/models/qwen", "", {"emptyDir": {}}, "/cache"),
    ("obs://bucket/models/qwen", "pvc:///model-cache/", {"persistentVolumeClaim": {"claimName": "model-cache"}},
     "/model-cache"),
    ("pvc:///model-cache/models/qwen", "pvc://model-cache", {"persistentVolumeClaim": {"claimName": "model-cache"}},
     "/model-cache"),
])
def test_model_uri_schemes(model_uri: str, cache_uri: str, volume: Obj, mount: str) -> None:
    import hashlib
    env = [{"name": "HF_ENDPOINT", "value": "https://hf-mirror.com"}, {"name": "OTHER", "value": "x"},
           {"name": "MS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "ms", "key": "token"}}},
           {"name": "MS_REVISION", "value": ""}]
    b = booster(modelURI=model_uri, cacheURI=cache_uri, env=env)
    if not cache_uri:
        del b["spec"]["backend"]["cacheURI"]
    ms = by_kind(convert.build(b))["ModelServing"]
    spec = ms["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]
    out = f"{mount}/{hashlib.md5(model_uri.encode()).hexdigest()}"
    # the downloader gets the backend's download variables (a valueFrom too, an empty value not)
    assert spec["initContainers"] == [downloader(model_uri, out, mount, [env[0], env[2]],
                                                 [{"secretRef": {"name": "test-secret"}}])]
    assert spec["volumes"][0] == {"name": "backend1-weights", **volume}
    assert spec["containers"][1]["volumeMounts"][0] == {"name": "backend1-weights", "mountPath": mount}
    assert f"--model {out} " in spec["containers"][1]["command"][2]


def test_custom_images() -> None:
    ms = by_kind(convert.build(booster(), Images("my/downloader:1", "my/runtime:2")))["ModelServing"]
    spec = ms["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]
    assert spec["initContainers"][0]["image"] == "my/downloader:1"
    assert spec["containers"][0]["image"] == "my/runtime:2"


# --- vLLM disaggregated ----------------------------------------------------------------------------
def test_vllm_disaggregated_golden() -> None:
    objs = by_kind(convert.build(pd_booster()))
    ms = objs["ModelServing"]
    assert ms["metadata"]["name"] == "test-model-backend1"
    assert ms["spec"]["schedulerName"] == "volcano" and ms["spec"]["replicas"] == 1
    assert ms["spec"]["template"]["gangPolicy"] == {"minRoleReplicas": {"prefill": 1, "decode": 1}}
    roles = {r["name"]: r for r in ms["spec"]["template"]["roles"]}
    assert list(roles) == ["prefill", "decode"]
    md5 = "568a486051fd302c338d84946c4f3d48"  # Kthena's expected output has the same directory
    base = [{"name": "ENDPOINT", "value": "https://obs.test.com"}, *POD, {"name": "VLLM_USE_V1", "value": "1"},
            *REDIS, {"name": "HF_HUB_OFFLINE", "value": "1"}]
    want_env = {
        "prefill": [*base, {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "decode": [*base, *({"name": n, "value": "eth0"} for n in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                                                                    "HCCL_SOCKET_IFNAME"))]}
    for kind, util, kv_role in (("prefill", "0.99", "kv_producer"), ("decode", "0.95", "kv_consumer")):
        role = roles[kind]
        assert role["replicas"] == 1 and role["workerReplicas"] == 0
        assert role["workerTemplate"] == {"spec": {"containers": []}}
        spec = role["entryTemplate"]["spec"]
        assert spec["volumes"] == [{"name": "backend1-weights", "hostPath": {"path": "/cache",
                                                                             "type": "DirectoryOrCreate"}}]
        assert spec["initContainers"] == [downloader("s3://aios_models/deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
                                                     f"/cache/{md5}", "/cache",
                                                     [{"name": "ENDPOINT", "value": "https://obs.test.com"}],
                                                     [{"secretRef": {"name": "downloader-secrets"}}])]
        runtime, engine = spec["containers"]
        assert runtime["args"][:4] == ["--port", "8100", "--engine", "vllmdisaggregated"]
        assert runtime["env"] == want_env[kind] and engine["env"] == want_env[kind]
        assert ("envFrom" in runtime) == (kind == "decode")  # as Kthena's template
        assert engine["name"] == "vllm" and engine["ports"] == [{"containerPort": 8000}]
        assert engine["imagePullPolicy"] == "IfNotPresent"
        assert engine["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
        # GPU + MooncakeConnector: the package is installed first; arguments are shell-quoted
        kv = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": kv_role}, separators=(",", ":"))
        assert engine["command"] == ["bash", "-c", (
            "pip install mooncake-transfer-engine && python3 -m vllm.entrypoints.openai.api_server "
            f"--model /cache/{md5} --gpu-memory-utilization {util} --kv-transfer-config '{kv}' "
            "--served-model-name ds-r1-qwen-7b-pd --tensor-parallel-size 16 --trust-remote-code")]
        assert engine["readinessProbe"] == {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5,
                                            "failureThreshold": 3, "initialDelaySeconds": 5}
        assert engine["livenessProbe"]["initialDelaySeconds"] == 180
    server = objs["ModelServer"]
    assert server["spec"] == {
        "model": "ds-r1-qwen-7b-pd", "inferenceEngine": "vLLM",
        "workloadSelector": {"matchLabels": {"workload.serving.volcano.sh/model-uid": "randomUID"},
                             "pdGroup": {"groupKey": "modelserving.volcano.sh/group-name",
                                         "prefillLabels": {"modelserving.volcano.sh/role": "prefill"},
                                         "decodeLabels": {"modelserving.volcano.sh/role": "decode"}}},
        "workloadPort": {"port": 8000}, "trafficPolicy": {"retry": {"attempts": 5, "retryInterval": "0s"}},
        "kvConnector": {"type": "mooncake"}}
    assert objs["ModelRoute"]["spec"]["modelName"] == "ds-r1-qwen-7b-pd"


def test_vllm_disaggregated_without_kv_and_skip_install() -> None:
    b = pd_booster(kv=False)
    server = by_kind(convert.build(b))["ModelServer"]
    assert "kvConnector" not in server["spec"]
    b = pd_booster()
    b["spec"]["backend"]["env"].append({"name": "KTHENA_SKIP_ENGINE_DEPENDENCY_INSTALL", "value": "true"})
    ms = by_kind(convert.build(b))["ModelServing"]
    cmd = ms["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][1]["command"]
    assert cmd[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.parametrize("connector,kv_type", [("NixlConnector", "nixl"), ("LMCacheConnectorV1", "lmcache"),
                                               ("MooncakeConnectorV1", "mooncake")])
def test_kv_connector_types(connector: str, kv_type: str) -> None:
    b = pd_booster()
    for w, role in zip(b["spec"]["backend"]["workers"], ("kv_producer", "kv_both")):
        w["config"]["kv-transfer-config"] = json.dumps({"kv_connector": connector, "kv_role": role})
    objs = by_kind(convert.build(b))
    assert objs["ModelServer"]["spec"]["kvConnector"] == {"type": kv_type}
    cmd = objs["ModelServing"]["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][1]["command"]
    assert cmd[2].startswith("PIP_DISABLE_PIP_VERSION_CHECK=1 pip install -U --no-cache-dir nixl && ") == \
        (connector == "NixlConnector")


# --- SGLang ----------------------------------------------------------------------------------------
def test_sglang_single_pod_golden() -> None:
    b = booster("SGLang")
    b["spec"]["backend"]["workers"][0].update(pods=1, replicas=2, config={"tp-size": 2, "mem-fraction-static": 0.8})
    objs = by_kind(convert.build(b))
    ms = objs["ModelServing"]
    role = ms["spec"]["template"]["roles"][0]
    assert role["name"] == "leader" and role["replicas"] == 2 and role["workerReplicas"] == 0
    assert "workerTemplate" not in role
    spec = role["entryTemplate"]["spec"]
    runtime, engine = spec["containers"]
    assert runtime["args"][:4] == ["--port", "8900", "--engine", "sglang"]
    env = [{"name": "ENDPOINT", "value": "https://obs.test.com"}, {"name": "RUNTIME_PORT", "value": "8900"}, *POD,
           *REDIS]
    assert engine["env"] == env and runtime["env"] == env  # no VLLM_USE_V1
    assert engine["command"] == ["python3", "-m", "sglang.launch_server", "--model-path", f"/tmp/test/{MD5_S3}",
                                 "--host", "0.0.0.0", "--port", "8000", "--enable-metrics",
                                 "--mem-fraction-static", "0.8", "--tp-size", "2"]
    assert engine["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    pre_stop = engine["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "sglang:num_running_reqs" in pre_stop and "sglang:num_queue_reqs" in pre_stop
    assert objs["ModelServer"]["spec"]["inferenceEngine"] == "SGLang"
    assert "kvConnector" not in objs["ModelServer"]["spec"]
    assert "pdGroup" not in objs["ModelServer"]["spec"]["workloadSelector"]


def test_sglang_multi_node() -> None:
    ms = by_kind(convert.build(booster("SGLang")))["ModelServing"]
    role = ms["spec"]["template"]["roles"][0]
    assert role["workerReplicas"] == 1
    entry = role["entryTemplate"]["spec"]["containers"][1]["command"]
    worker = role["workerTemplate"]["spec"]["containers"][0]
    multi = ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "$(ENTRY_ADDRESS):5000"]
    assert entry[10:16] == multi
    assert worker["command"][10:16] == ["--nnodes", "2", "--node-rank", "$(WORKER_INDEX)", "--dist-init-addr",
                                        "$(ENTRY_ADDRESS):5000"]
    assert worker["name"] == "backend1-sglang-worker" and "readinessProbe" not in worker
    assert role["workerTemplate"]["spec"]["initContainers"][0]["name"] == "test-model-model-downloader"


def test_sglang_disaggregated_golden() -> None:
    b = pd_booster("SGLangDisaggregated", kv=False)
    b["spec"]["backend"]["workers"][0]["config"]["disaggregation-bootstrap-port"] = 9100
    b["spec"]["backend"]["workers"][1]["config"]["disaggregation-transfer-backend"] = "nixl"
    objs = by_kind(convert.build(b))
    roles = {r["name"]: r for r in objs["ModelServing"]["spec"]["template"]["roles"]}
    assert list(roles) == ["prefill", "decode"]
    md5 = "568a486051fd302c338d84946c4f3d48"
    p = roles["prefill"]["entryTemplate"]
    d = roles["decode"]["entryTemplate"]
    assert p["metadata"]["annotations"] == {"router.kthena.io/bootstrap-port": "9100"}
    assert "annotations" not in d["metadata"]
    pe, de = p["spec"]["containers"][1], d["spec"]["containers"][1]
    head = ["python3", "-m", "sglang.launch_server", "--model-path", f"/cache/{md5}", "--host", "0.0.0.0", "--port",
            "8000", "--enable-metrics"]
    assert pe["command"] == [*head, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "9100",
                             "--gpu-memory-utilization", "0.99", "--served-model-name", "ds-r1-qwen-7b-pd",
                             "--tensor-parallel-size", "16", "--trust-remote-code"]
    assert de["command"] == [*head, "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
                             "--gpu-memory-utilization", "0.95", "--served-model-name", "ds-r1-qwen-7b-pd",
                             "--tensor-parallel-size", "16", "--trust-remote-code"]
    assert pe["ports"] == [{"containerPort": 8000}, {"containerPort": 9100, "name": "bootstrap"}]
    assert de["ports"] == [{"containerPort": 8000}]
    assert pe["name"] == de["name"] == "sglang"
    server = objs["ModelServer"]["spec"]
    assert server["inferenceEngine"] == "SGLang" and "kvConnector" not in server
    assert server["workloadSelector"]["pdGroup"]["prefillLabels"] == {"modelserving.volcano.sh/role": "prefill"}


def test_sglang_default_bootstrap_port() -> None:
    objs = by_kind(convert.build(pd_booster("SGLangDisaggregated", kv=False)))
    prefill = objs["ModelServing"]["spec"]["template"]["roles"][0]["entryTemplate"]
    assert prefill["metadata"]["annotations"] == {"router.kthena.io/bootstrap-port": "8998"}


# --- engine arguments --------------------------------------------------------------------------------
def test_engine_args_rendering() -> None:
    from controller.booster.common import engine_args
    assert engine_args({"b_key": True, "a": "", "c": 1.0, "d": 0.5, "e": {"x": [1, 2]}, "f": False, "g": None}) == [
        "--a", "--b-key", "true", "--c", "1", "--d", "0.5", "--e", '{"x":[1,2]}', "--f", "false", "--g"]


# --- revision ---------------------------------------------------------------------------------------
def test_revision_ignores_replicas_and_follows_the_template() -> None:
    a = booster()
    b = copy.deepcopy(a)
    b["spec"]["backend"]["replicas"] = 7
    b["spec"]["backend"]["workers"][0]["replicas"] = 3
    rev = convert.serving_revision
    assert rev(a["spec"]["backend"]) == rev(b["spec"]["backend"])
    b["spec"]["backend"]["workers"][0]["image"] = "vllm-server:v2"
    assert rev(a["spec"]["backend"]) != rev(b["spec"]["backend"])
    assert len(rev(a["spec"]["backend"])) in range(8, 11)


# --- autoscaling --------------------------------------------------------------------------------------
def test_autoscaling_policy_when_asked() -> None:
    b = booster()
    b["metadata"]["annotations"] = {names.ANNOTATION_AUTOSCALING: json.dumps({
        "minReplicas": 1, "maxReplicas": 4, "tolerancePercent": 5,
        "metrics": [{"name": "kthena:num_requests_waiting", "targetValue": "10"}]})}
    policy = by_kind(convert.build(b))["AutoscalingPolicy"]
    assert policy["metadata"]["name"] == "test-model-backend1"
    assert policy["metadata"]["ownerReferences"] == OWNER
    assert policy["spec"] == {
        "tolerancePercent": 5, "metrics": [{"name": "kthena:num_requests_waiting", "targetValue": "10"}],
        "homogeneousTarget": {"target": {"targetRef": {"kind": "ModelServing", "name": "test-model-backend1"},
                                         "metricSources": {"kthena:num_requests_waiting": {"pod": {
                                             "name": "kthena:num_requests_waiting",
                                             "labelSelector": {"matchLabels": {"modelserving.volcano.sh/role":
                                                                               "leader"}}}}}},
                              "minReplicas": 1, "maxReplicas": 4}}


# --- validation -------------------------------------------------------------------------------------
def _errors(b: Obj) -> list[tuple[str, str]]:
    return [(e.field, e.message) for e in convert.validate(b)]


@pytest.mark.parametrize("mutate,field,text", [
    (lambda b: b["spec"]["backend"]["workers"].append(dict(b["spec"]["backend"]["workers"][0])),
     "spec.backend.workers", "exactly one worker"),
    (lambda b: b["spec"]["backend"]["workers"][0].update(type="prefill"), "spec.backend.workers[0].type",
     "must be 'server'"),
    (lambda b: b["spec"]["backend"]["workers"][0].update(image="vllm server"), "spec.backend.workers[0].image",
     "whitespace"),
    (lambda b: b["spec"]["backend"]["workers"][0].pop("image"), "spec.backend.workers[0].image", "required"),
    (lambda b: b["spec"]["backend"]["workers"][0]["config"].update(port="http"),
     "spec.backend.workers[0].config.port", "invalid port"),
    (lambda b: b["spec"]["backend"].update(modelURI="pvc:///models/qwen", cacheURI="hostpath:///x"),
     "spec.backend.cacheURI", "cacheURI must also use pvc://"),
    (lambda b: b["spec"]["backend"].update(modelURI="pvc:///other/qwen", cacheURI="pvc://models"),
     "spec.backend.modelURI", "not reachable"),
    (lambda b: b["spec"]["backend"].update(modelURI="pvc:///models/../etc", cacheURI="pvc://models"),
     "spec.backend.modelURI", "'..'"),
    (lambda b: b["metadata"].update(annotations={names.ANNOTATION_AUTOSCALING: "{"}),
     f"metadata.annotations[{names.ANNOTATION_AUTOSCALING}]", "not JSON"),
    (lambda b: b["metadata"].update(annotations={names.ANNOTATION_AUTOSCALING: '{"minReplicas": 3, "maxReplicas": 2, '
                                                                              '"metrics": [{"name": "m"}]}'}),
     f"metadata.annotations[{names.ANNOTATION_AUTOSCALING}].maxReplicas", ">= minReplicas"),
    (lambda b: b["metadata"].update(annotations={names.ANNOTATION_AUTOSCALING: '{"min": 1}'}),
     f"metadata.annotations[{names.ANNOTATION_AUTOSCALING}]", "unknown field(s) min"),
])
def test_validation_names_the_field(mutate: Any, field: str, text: str) -> None:
    b = booster()
    mutate(b)
    errs = _errors(b)
    assert any(f == field and text in m for f, m in errs), errs
    with pytest.raises(ConvertError):
        convert.build(b)


@pytest.mark.parametrize("mutate,field,text", [
    (lambda ws: ws.pop(), "spec.backend.workers", "exactly one decode worker"),
    (lambda ws: ws[1].update(type="server"), "spec.backend.workers[1].type", "'prefill' or 'decode'"),
    (lambda ws: ws[1]["config"].pop("kv-transfer-config"), "spec.backend.workers", "no kv-transfer-config"),
    (lambda ws: ws[1]["config"].update({"kv-transfer-config": '{"kv_connector":"NixlConnector",'
                                                              '"kv_role":"kv_consumer"}'}),
     "spec.backend.workers", "mismatch"),
    (lambda ws: ws[0]["config"].update({"kv-transfer-config": '{"kv_connector":"MooncakeConnector",'
                                                              '"kv_role":"kv_consumer"}'}),
     "spec.backend.workers[0].config.kv-transfer-config", "invalid kv_role"),
    (lambda ws: ws[0]["config"].update({"kv-transfer-config": '{"kv_connector":"Foo","kv_role":"kv_producer"}'}),
     "spec.backend.workers[0].config.kv-transfer-config", "unsupported kv_connector"),
    (lambda ws: ws[1]["config"].update(port=9000), "spec.backend.workers[1].config.port", "different engine ports"),
])
def test_disaggregated_validation(mutate: Any, field: str, text: str) -> None:
    b = pd_booster()
    mutate(b["spec"]["backend"]["workers"])
    errs = _errors(b)
    assert any(f == field and text in m for f, m in errs), errs


def test_sglang_pd_rejects_vllm_kv_config() -> None:
    errs = _errors(pd_booster("SGLangDisaggregated"))
    assert any(f.endswith("config.kv-transfer-config") and "SGLang" in m for f, m in errs), errs


def test_autoscaling_of_a_disaggregated_backend_is_refused() -> None:
    b = pd_booster()
    b["metadata"]["annotations"] = {names.ANNOTATION_AUTOSCALING: '{"minReplicas": 1, "maxReplicas": 2, '
                                                                  '"metrics": [{"name": "m", "targetValue": "1"}]}'}
    assert any("disaggregatedTarget" in m for _, m in _errors(b))


def test_valid_boosters_have_no_errors() -> None:
    for b in (booster(), booster("SGLang"), pd_booster(), pd_booster("SGLangDisaggregated", kv=False)):
        assert convert.validate(b) == []


# --- desired state vs live ------------------------------------------------------------------------------
def test_normalize_prunes_and_defaults_like_the_apiserver() -> None:
    ms = by_kind(convert.build(booster()))["ModelServing"]
    spec = desired.normalize(ms["spec"], desired.spec_schema("ModelServing"))
    assert spec["schedulerName"] == "volcano"  # the CRD default
    assert spec["recoveryPolicy"] == "RoleRecreate"
    ms2 = copy.deepcopy(ms)
    ms2["spec"]["topologySpreadConstraints"] = []  # not in the CRD: pruned (Kthena's template has it)
    assert desired.normalize(ms2["spec"], desired.spec_schema("ModelServing")) == spec


def test_patch_for_carries_only_what_differs() -> None:
    ms = by_kind(convert.build(booster()))["ModelServing"]
    live = copy.deepcopy(ms)
    live["spec"] = desired.normalize(ms["spec"], desired.spec_schema("ModelServing"))
    live["metadata"]["labels"]["team"] = "a"  # someone else's label: kept
    live["metadata"]["resourceVersion"] = "7"
    assert desired.patch_for(ms, live) == {}
    live["spec"]["replicas"] = 5
    live["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][1]["image"] = "evil"
    live["metadata"]["labels"][names.LABEL_MODEL_NAME] = "other"
    patch = desired.patch_for(ms, live)
    assert patch["metadata"] == {"labels": {names.LABEL_MODEL_NAME: "test-model"}}
    assert patch["spec"]["replicas"] == 0
    assert patch["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][1]["image"] == \
        "vllm-server:latest"  # lists are replaced whole (merge patch)
    assert set(patch["spec"]) == {"replicas", "template"}
    # an autoscaled ModelServing keeps its replicas; minRoleReplicas is immutable: kept as created
    live["spec"]["template"]["gangPolicy"]["minRoleReplicas"] = {"leader": 9}
    patch = desired.patch_for(ms, live, autoscaled=True)
    assert "replicas" not in patch["spec"] and "gangPolicy" not in patch["spec"]["template"]
