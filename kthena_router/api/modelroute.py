"""ModelRoute (networking.serving.volcano.sh/v1alpha1): which ModelServers or external providers
serve a public model name."""

from __future__ import annotations

from .common import NETWORKING, VERSION, conditions, model_match, observed_generation, parent_reference
from .schema import AGE, Column, Field, Kind, Rule, array, integer, obj, opt, req, string

__all__ = ["MODEL_ROUTE", "RATE_UNITS", "SESSION_SOURCE_TYPES"]

RATE_UNITS = ("second", "minute", "hour", "day", "month")
SESSION_SOURCE_TYPES = ("Header", "Query", "Cookie", "JWTClaim")

_TARGET = obj(
    "A backend of the rule: a ModelServer or an ExternalModelProvider in the route's namespace.",
    opt("modelServerName", string("Name of a ModelServer.")),
    opt("externalModelProviderName", string("Name of an ExternalModelProvider.")),
    opt("weight", integer("Share of the rule's traffic, 0 to 100 (a canary split); set on all targets or none.",
                          minimum=0, maximum=100, default=100)),
    rules=(Rule('(has(self.modelServerName) && self.modelServerName != "") != '
                '(has(self.externalModelProviderName) && self.externalModelProviderName != "")',
                "exactly one of modelServerName or externalModelProviderName must be set"),),
)

_RULE = obj(
    "A routing rule; the first rule whose modelMatch holds is used.",
    opt("name", string("Name of the rule.")),
    opt("modelMatch", model_match()),
    req("targetModels", array(_TARGET, "Where matching requests go.", min_items=1, max_items=16)),
)

_RATE_LIMIT = obj(
    "Token rate limit for the model; no limit when unset.",
    opt("inputTokensPerUnit", integer("Input (prompt) tokens allowed per unit.", minimum=1)),
    opt("outputTokensPerUnit", integer("Output tokens allowed per unit.", minimum=1)),
    req("unit", string("The time unit of the limits.", enum=RATE_UNITS, default="second")),
    opt("global", obj("Shares the limit between router replicas.",
                      opt("redis", obj("The Redis server that holds the shared counters.",
                                       req("address", string("host:port of the Redis server.")))))),
)

# Kthena's session-stickiness proposal: read by the router's file mode; not in Kthena's CRD yet,
# so not in ours either (crd=False).
_SESSION_STICKY = obj(
    "Pins a session key to the pod it was last sent to.",
    opt("sources", array(obj("Where the session key is read; the first non-empty source wins.",
                             req("type", string("Kind of source.", enum=SESSION_SOURCE_TYPES)),
                             req("name", string("Header, query parameter, cookie or JWT claim name."))),
                         "Session key sources, in order.", min_items=1, max_items=16)),
    opt("sessionAffinitySeconds", integer("How long a session stays pinned after its last request.", minimum=1)),
)

SPEC = obj(
    "Which backends serve a model name, with optional rules and rate limits.",
    opt("modelName", string("The model name clients send in the body's \"model\".",
                            rules=(Rule("self == oldSelf", "modelName is immutable"),))),
    opt("loraAdapters", array(string(), "LoRA adapter names this route also answers to.", max_items=10)),
    opt("parentRefs", array(parent_reference(), "Gateways the route attaches to; all of the namespace's when empty.")),
    req("rules", array(_RULE, "Ordered rules; the first match wins.", max_items=16)),
    opt("rateLimit", _RATE_LIMIT),
    Field("sessionSticky", _SESSION_STICKY, crd=False),
    rules=(Rule('(has(self.modelName) && self.modelName != "") || '
                '(has(self.loraAdapters) && size(self.loraAdapters) > 0)',
                "modelName and loraAdapters cannot both be empty"),),
)

MODEL_ROUTE = Kind(
    group=NETWORKING, version=VERSION, kind="ModelRoute", plural="modelroutes",
    description="ModelRoute routes requests for a model name to ModelServers or external providers.",
    spec=SPEC, spec_required=True,
    # Kthena's status is an empty object; ours only adds status (never spec) fields.
    status=obj("Observed state, written by the router holding the status Lease.",
               opt("observedGeneration", observed_generation()),
               opt("conditions", conditions("Accepted and ResolvedRefs."))),
    columns=(Column("Model", "string", ".spec.modelName", "Model name clients request"),
             Column("Accepted", "string", ".status.conditions[?(@.type=='Accepted')].status", "Served by the router"),
             AGE),
)
