"""ModelBooster (workload.serving.volcano.sh/v1alpha1): one object that launches a model (the
controller derives a ModelServing, a ModelServer and a ModelRoute from it)."""

from __future__ import annotations

from .common import VERSION, WORKLOAD, conditions, model_match, observed_generation
from .k8s_types import core
from .schema import AGE, Column, Kind, array, integer, json_any, obj, opt, req, string

__all__ = ["BACKEND_TYPES", "MODEL_BOOSTER", "WORKER_TYPES"]

# Kthena's enum has vLLM and vLLMDisaggregated; its Go type declares SGLang too. We add SGLang and
# SGLangDisaggregated (our templates, docs/booster.md).
BACKEND_TYPES = ("vLLM", "vLLMDisaggregated", "SGLang", "SGLangDisaggregated")
WORKER_TYPES = ("server", "prefill", "decode", "controller", "coordinator")
_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

_WORKER = obj(
    "A kind of engine pod of the backend.",
    opt("type", string("Worker kind.", enum=WORKER_TYPES, default="server")),
    opt("image", string("Container image.")),
    opt("replicas", integer("Replicas of this worker.", minimum=0, maximum=1000000)),
    opt("pods", integer("Pods per replica.", minimum=0, maximum=1000000)),
    opt("resources", core("ResourceRequirements", "Compute resources of the engine container.")),
    opt("affinity", core("Affinity", "Scheduling affinity.")),
    opt("tolerations", array(core("Toleration"), "Tolerations.", list_type="atomic")),
    opt("config", json_any("Engine arguments (e.g. vLLM's engine args) as JSON.")),
)

_BACKEND = obj(
    "The inference backend: engine type, model source, cache and workers.",
    req("name", string("Backend name.", pattern=_NAME)),
    req("type", string("Backend type.", enum=BACKEND_TYPES)),
    req("modelURI", string("Where the model is fetched: hf://, ms://, s3://, obs:// or pvc://.",
                           pattern=r"^(hf://|s3://|obs://|pvc://|ms://).+")),
    opt("cacheURI", string("Where downloaded models are kept: pvc:// or hostpath:// (an emptyDir when unset).",
                           pattern=r"^(hostpath://|pvc://).+")),
    opt("envFrom", array(core("EnvFromSource"), "Environment sources of the containers.", list_type="atomic")),
    opt("env", array(core("EnvVar"), "Environment variables of the containers.", list_type="map",
                     list_map_keys=("name",))),
    req("replicas", integer("Replicas of the backend.", minimum=0, maximum=1000000)),
    req("workers", array(_WORKER, "The workers.", min_items=1, max_items=1000)),
    opt("schedulerName", string("Scheduler of the pods.")),
    opt("runtimeClassName", string("RuntimeClass of the pods.")),
)

SPEC = obj(
    "A model to launch and route.",
    opt("name", string("Model name (the object's name cannot hold upper case).", max_length=64, pattern=_NAME)),
    opt("owner", string("Owner of the model.")),
    req("backend", _BACKEND),
    opt("modelMatch", model_match()),
)

MODEL_BOOSTER = Kind(
    group=WORKLOAD, version=VERSION, kind="ModelBooster", plural="modelboosters",
    description="ModelBooster launches a model: engine pods, a ModelServer and a ModelRoute from one object.",
    spec=SPEC,
    status=obj("Observed state, written by the controller.",
               opt("conditions", conditions("Initialized, Active, Failed.", keyed=True)),
               opt("observedGeneration", observed_generation())),
    columns=(Column("Active", "string", ".status.conditions[?(@.type=='Active')].status", "Model is serving"), AGE),
)
