"""ModelServing (workload.serving.volcano.sh/v1alpha1): replicated ServingGroups of role pods
(entry + workers), gang-scheduled; the scale subresource drives spec.replicas."""

from __future__ import annotations

from .common import VERSION, WORKLOAD, conditions, observed_generation
from .k8s_types import core
from .schema import (
    AGE, Column, Kind, Node, Rule, Scale, array, int_or_string, integer, json_any, map_of, obj, opt, req, string,
)

__all__ = [
    "MODEL_SERVING", "PLUGIN_TYPES", "RECOVERY_POLICIES", "ROLLOUT_TYPES", "TOPOLOGY_MODES", "pod_template",
]

RECOVERY_POLICIES = ("ServingGroupRecreate", "RoleRecreate", "None")
ROLLOUT_TYPES = ("ServingGroupRollingUpdate", "RoleRollingUpdate")
PLUGIN_TYPES = ("BuiltIn",)
TOPOLOGY_MODES = ("hard", "soft")


def pod_template(description: str) -> Node:
    """Kthena's PodTemplateSpec: labels/annotations and a full core/v1 PodSpec."""
    return obj(description,
               opt("metadata", obj("Labels and annotations of the pod.",
                                   opt("labels", map_of(string(), "Pod labels.")),
                                   opt("annotations", map_of(string(), "Pod annotations.")))),
               opt("spec", core("PodSpec", "The pod's spec.")))


def _max_unavailable() -> Node:
    return int_or_string("Most replicas unavailable during an update: a number or a percentage (rounded down; "
                         "must not resolve to 0).", default=1)


def _partition() -> Node:
    return int_or_string("The first N replicas (a number or a percentage, rounded up) are not updated.")


def _topology(description: str) -> Node:
    """Volcano's NetworkTopologySpec (scheduling.volcano.sh/v1beta1)."""
    return obj(description,
               opt("mode", string("hard: never cross the tier; soft: best effort.", enum=TOPOLOGY_MODES,
                                  default="hard")),
               opt("highestTierAllowed", integer("Highest network tier pods may span.", format=None, minimum=0)),
               opt("highestTierName", string("Highest tier by name (not with highestTierAllowed).",
                                             max_length=253)))


_ROLE = obj(
    "A role of the ServingGroup (e.g. prefill, decode): replicas of one entry pod plus workers.",
    req("name", string("Role name, unique in the group.", max_length=12,
                       pattern=r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")),
    opt("replicas", integer("Replicas of this role.", default=1)),
    req("entryTemplate", pod_template("The entry pod (one per role replica).")),
    req("workerReplicas", integer("Worker pods per role replica.")),
    opt("workerTemplate", pod_template("The worker pods.")),
    opt("maxUnavailable", _max_unavailable()),
    opt("partition", _partition()),
)

_SERVING_GROUP = obj(
    "One ServingGroup: the roles that together serve the model.",
    opt("restartGracePeriodSeconds", integer("Wait before rebuilding a failed group.", format="int64", default=0)),
    opt("gangPolicy", obj("Gang scheduling.",
                          opt("minRoleReplicas", map_of(integer(), "Minimum replicas per role for the gang.",
                                                        rules=(Rule("self == oldSelf",
                                                                    "minRoleReplicas is immutable"),))))),
    opt("networkTopology", obj("Network-topology-aware scheduling (Volcano).",
                               opt("groupPolicy", _topology("For all pods of the group.")),
                               opt("rolePolicy", _topology("For the pods of one role replica.")))),
    req("roles", array(_ROLE, "The roles.", min_items=1, max_items=4,
                       rules=(Rule("self.all(x, self.exists_one(y, y.name == x.name))", "roles name must be unique"),))),
    rules=(Rule("!has(oldSelf.gangPolicy) || has(self.gangPolicy)", "gangPolicy is required once set"),),
)

_PLUGIN = obj(
    "A plugin that customises the serving pods.",
    req("name", string("Unique name of the plugin instance.")),
    req("type", string("Plugin category.", enum=PLUGIN_TYPES, default="BuiltIn")),
    opt("config", json_any("Plugin configuration, interpreted by the plugin.")),
    opt("scope", obj("Where the plugin applies; all pods by default.",
                     opt("roles", array(string(), "Only these roles.")),
                     opt("target", string("All, Entry or Worker pods.")))),
)

SPEC = obj(
    "Replicated ServingGroups and how they are updated and recovered.",
    opt("replicas", integer("Number of ServingGroups.", default=1)),
    opt("schedulerName", string("Scheduler of the pods.", default="volcano")),
    opt("plugins", array(_PLUGIN, "Plugins applied to the pods.")),
    req("template", _SERVING_GROUP),
    opt("rolloutStrategy", obj(
        "How replicas are updated.",
        req("type", string("Update granularity.", enum=ROLLOUT_TYPES, default="ServingGroupRollingUpdate")),
        opt("rollingUpdateConfiguration", obj("Settings of ServingGroupRollingUpdate (not with RoleRollingUpdate).",
                                              opt("maxUnavailable", _max_unavailable()),
                                              opt("partition", _partition()))),
    )),
    opt("recoveryPolicy", string("What is recreated when a pod fails.", enum=RECOVERY_POLICIES,
                                 default="RoleRecreate")),
)

STATUS = obj(
    "Observed state, written by the controller.",
    opt("observedGeneration", observed_generation()),
    opt("replicas", integer("ServingGroups created.")),
    opt("currentReplicas", integer("ServingGroups at the current revision.")),
    opt("updatedReplicas", integer("ServingGroups at the update revision.")),
    opt("availableReplicas", integer("ServingGroups ready.")),
    opt("currentRevision", string("Revision of the groups not yet updated.")),
    opt("updateRevision", string("Revision of the current spec.")),
    opt("conditions", conditions("Available, Progressing, UpdateInProgress.")),
    opt("labelSelector", string("Selector of the pods (for the scale subresource).")),
)

MODEL_SERVING = Kind(
    group=WORKLOAD, version=VERSION, kind="ModelServing", plural="modelservings",
    description="ModelServing runs replicated, gang-scheduled groups of inference engine pods.",
    spec=SPEC, status=STATUS,
    columns=(Column("Replicas", "integer", ".status.replicas", "ServingGroups"),
             Column("Available", "integer", ".status.availableReplicas", "ServingGroups ready"),
             Column("Updated", "integer", ".status.updatedReplicas", "ServingGroups at the latest revision"),
             AGE),
    scale=Scale(".spec.replicas", ".status.replicas", ".status.labelSelector"),
)
