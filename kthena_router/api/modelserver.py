"""ModelServer (networking.serving.volcano.sh/v1alpha1): the engine pods that serve a model."""

from __future__ import annotations

from .common import NETWORKING, VERSION, conditions, observed_generation
from .schema import AGE, Column, Kind, duration, integer, map_of, obj, opt, req, string

__all__ = ["INFERENCE_ENGINES", "KV_CONNECTORS", "MODEL_SERVER", "PROTOCOLS"]

INFERENCE_ENGINES = ("vLLM", "SGLang")
PROTOCOLS = ("http", "https")
KV_CONNECTORS = ("http", "lmcache", "nixl", "mooncake")

SPEC = obj(
    "The engine pods behind a model and how the router talks to them.",
    opt("model", string("The model name the engines serve; the router rewrites the request's \"model\" to it.",
                        max_length=256)),
    req("inferenceEngine", string("The inference engine.", enum=INFERENCE_ENGINES)),
    req("workloadSelector", obj(
        "The pods (in the same namespace) that serve the model.",
        opt("matchLabels", map_of(string(), "Labels every serving pod carries.")),
        opt("pdGroup", obj(
            "Prefill/decode disaggregation: how pods pair up and which role each has.",
            req("groupKey", string("Pod label whose value names the group; pods pair within a group.")),
            req("prefillLabels", map_of(string(), "Labels of prefill pods.")),
            req("decodeLabels", map_of(string(), "Labels of decode pods.")))),
    )),
    req("workloadPort", obj(
        "The engines' port.",
        req("port", integer("Port number.", minimum=1, maximum=65535)),
        opt("protocol", string("Scheme used to reach the engines.", enum=PROTOCOLS, default="http")),
    )),
    opt("trafficPolicy", obj(
        "Timeouts and retries towards the engines.",
        opt("timeout", duration("Bound on connecting and waiting for the response headers (not the body).")),
        opt("retry", obj("Retry policy.",
                         opt("attempts", integer("How many times a failed request is retried.")),
                         opt("retryInterval", duration("Pause between attempts.", default="100ms")))),
    )),
    opt("kvConnector", obj(
        "How KV cache moves from prefill to decode (vLLM prefill/decode pairs).",
        opt("type", string("Connector type.", enum=KV_CONNECTORS, default="http")))),
)

MODEL_SERVER = Kind(
    group=NETWORKING, version=VERSION, kind="ModelServer", plural="modelservers",
    description="ModelServer describes the inference engine pods that serve a model.",
    spec=SPEC,
    # Kthena's status is an empty object; ours only adds status (never spec) fields.
    status=obj("Observed state, written by the router holding the status Lease.",
               opt("observedGeneration", observed_generation()),
               opt("conditions", conditions("Ready.")),
               opt("readyEndpoints", integer("Ready, non-terminating endpoints (pods).", minimum=0)),
               opt("readyPrefillEndpoints", integer("PD servers: ready prefill endpoints.", minimum=0)),
               opt("readyDecodeEndpoints", integer("PD servers: ready decode endpoints.", minimum=0))),
    columns=(Column("Engine", "string", ".spec.inferenceEngine", "Inference engine"),
             Column("Port", "integer", ".spec.workloadPort.port", "Engine port"),
             Column("Protocol", "string", ".spec.workloadPort.protocol", "Engine protocol"),
             Column("Ready", "integer", ".status.readyEndpoints", "Ready endpoints"),
             AGE),
)
