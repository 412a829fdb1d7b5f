"""AutoscalingPolicy (workload.serving.volcano.sh/v1alpha1): metric-driven scaling of
ModelServings (one, several by cost, or the roles of a disaggregated one)."""

from __future__ import annotations

from .common import VERSION, WORKLOAD, conditions, observed_generation
from .k8s_types import core
from .schema import (
    Kind, Node, Rule, array, boolean, duration, integer, map_of, obj, opt, quantity, req, string,
)

__all__ = ["AUTOSCALING_POLICY", "SELECT_POLICIES"]

SELECT_POLICIES = ("Or", "And")
_MAX = 1000000


def _metrics(description: str, min_items: int | None = None) -> Node:
    return array(obj("A metric and its target value.",
                     req("name", string("Metric key (matches metricSources keys).", min_length=1)),
                     req("targetValue", quantity("Target value per replica."))),
                 description, min_items=min_items)


def _stable() -> Node:
    return obj(
        "Stable scaling: averages over a window.",
        opt("instances", integer("Most replicas added or removed per period.", minimum=0, default=1)),
        opt("percent", integer("Most percent of the current replicas changed per period.", minimum=0, maximum=1000,
                               default=100)),
        opt("period", duration("Evaluation period.", default="15s")),
        opt("selectPolicy", string("Or: either limit allows the change; And: both must.", enum=SELECT_POLICIES,
                                   default="Or")),
        opt("stabilizationWindow", duration("Window that damps oscillation.")),
    )


_PANIC = obj(
    "Panic scaling for sudden load (never scales down).",
    opt("percent", integer("Most percent of the current replicas added per period.", minimum=0, maximum=1000,
                           default=1000)),
    req("period", duration("Evaluation period.")),
    opt("panicThresholdPercent", integer("Panic starts when a metric exceeds this percent of its target.",
                                         minimum=110, maximum=1000, default=200)),
    opt("panicModeHold", duration("How long panic mode lasts.", default="60s")),
)

_METRIC_SOURCE = obj(
    "Where a metric is read: the pods' /metrics or a Prometheus query.",
    opt("pod", obj("Scrape each target pod.",
                   opt("name", string("Prometheus metric name; the metric key when unset.")),
                   opt("uri", string("Path of the metrics endpoint.", default="/metrics", pattern="^/")),
                   opt("port", integer("Port of the metrics endpoint.", minimum=1, maximum=65535, default=8100)),
                   opt("labelSelector", core("meta.LabelSelector", "Only pods that also match this.")))),
    opt("prometheus", obj("An instant query against a Prometheus server.",
                          req("serverURL", string("Base URL of the Prometheus API.", format="uri", min_length=1)),
                          req("query", string("PromQL returning one value.", min_length=1)),
                          opt("auth", obj("Authentication (reserved).")))),
    rules=(Rule("has(self.pod) || has(self.prometheus)", "one metric source backend config is required"),
           Rule("!(has(self.pod) && has(self.prometheus))", "pod and prometheus configs are mutually exclusive")),
)


def _target() -> Node:
    return obj("A scaled object and how its metrics are read.",
               req("targetRef", core("ObjectReference", "The ModelServing to scale.")),
               opt("metricSources", map_of(_METRIC_SOURCE, "Metric sources by metric key.")))


def _min_max() -> tuple:
    return (req("minReplicas", integer("Fewest replicas.", minimum=0, maximum=_MAX)),
            req("maxReplicas", integer("Most replicas.", minimum=1, maximum=_MAX)))


SPEC = obj(
    "Scaling rules and the scaled target (exactly one of the three target kinds).",
    opt("tolerancePercent", integer("Deviation (percent of current replicas) tolerated before scaling.",
                                    minimum=0, maximum=100, default=10)),
    opt("metrics", _metrics("Metrics and targets (roles may override them).")),
    opt("behavior", obj("Scale-up and scale-down behaviour.",
                        opt("scaleUp", obj("Scaling up.",
                                           opt("stablePolicy", _stable()),
                                           opt("panicPolicy", _PANIC))),
                        opt("scaleDown", _stable()))),
    opt("homogeneousTarget", obj("Scale one ModelServing.", opt("target", _target()), *_min_max())),
    opt("heterogeneousTarget", obj(
        "Spread replicas over several ModelServings, cheapest capacity first.",
        opt("params", array(obj("One ModelServing and its cost.",
                                opt("target", _target()),
                                opt("cost", integer("Relative cost of a replica.", minimum=0)),
                                *_min_max()),
                            "The ModelServings.", min_items=1)),
        opt("costExpansionRatePercent", integer("Growth rate of the cost blocks, in percent.", minimum=0,
                                                default=200)),
    )),
    opt("disaggregatedTarget", obj(
        "Scale the roles of one disaggregated ModelServing together.",
        req("targetRef", core("ObjectReference", "The ModelServing.")),
        req("roles", map_of(obj("Scaling of one role.", *_min_max(),
                                opt("metrics", _metrics("Metrics of this role (instead of spec.metrics).",
                                                        min_items=1)),
                                opt("metricSources", map_of(_METRIC_SOURCE, "Metric sources by metric key."))),
                            "Roles by name.", min_properties=1, max_properties=2)),
        opt("ratioConstraint", obj(
            "Keeps replicas[numeratorRole] / replicas[denominatorRole] within [minRatio, maxRatio].",
            req("numeratorRole", string("Numerator role.")),
            req("denominatorRole", string("Denominator role.")),
            req("minRatio", quantity("Lowest ratio.")),
            req("maxRatio", quantity("Highest ratio.")),
            rules=(Rule("self.numeratorRole != self.denominatorRole", "numeratorRole and denominatorRole must differ"),),
        )),
        rules=(Rule("!has(self.ratioConstraint) || size(self.roles) >= 2",
                    "roles must contain at least two entries when ratioConstraint is configured"),),
    )),
    # Kthena checks this in a validating webhook; a CEL rule does it without one.
    rules=(Rule("[has(self.homogeneousTarget), has(self.heterogeneousTarget), has(self.disaggregatedTarget)]"
                ".filter(x, x).size() == 1",
                "exactly one of homogeneousTarget, heterogeneousTarget or disaggregatedTarget must be set"),),
)


def _scaling_status(description: str) -> Node:
    return obj(description,
               opt("name", string("The target or role.")),
               req("currentReplicas", integer("Replicas observed.")),
               req("desiredReplicas", integer("Replicas wanted by the metrics.")),
               opt("mode", string("Stable or Panic.")),
               opt("lastScaleTime", string("When it was last scaled.", format="date-time")))


STATUS = obj(
    "Observed state, written by the controller.",
    opt("observedGeneration", observed_generation()),
    opt("conditions", conditions("Ready, TargetFound, RatioConstraintViolated.", keyed=True)),
    opt("homogeneousStatus", _scaling_status("State of the homogeneous target.")),
    opt("disaggregatedStatus", obj("State of the disaggregated target.",
                                   req("roles", array(_scaling_status("One role."), "Per role.")),
                                   opt("ratioStatus", obj("The ratio now.",
                                                          req("numeratorRole", string()),
                                                          req("denominatorRole", string()),
                                                          opt("currentRatio", string()))),
                                   opt("ratioAdjusted", boolean("The ratio overrode the metrics last time.")))),
    opt("heterogeneousStatus", array(_scaling_status("One target."), "Per target.")),
)

AUTOSCALING_POLICY = Kind(
    group=WORKLOAD, version=VERSION, kind="AutoscalingPolicy", plural="autoscalingpolicies",
    description="AutoscalingPolicy scales ModelServings from metrics.",
    spec=SPEC, status=STATUS,
)
