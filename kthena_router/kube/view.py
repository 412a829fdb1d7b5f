"""What the watcher hands to the status writer after each sync: the config it built, and the
objects it came from. CONTRACT between kube/source (watch) and kube/status (status writer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kthena_router.config.errors import ConfigProblem
from kthena_router.config.model import RouterConfig

__all__ = ["ClusterView", "ObjectKey", "ObjectMeta"]

# (kind, namespace, name), kind as in the CRD: "ModelRoute" | "ModelServer" | "ExternalModelProvider"
ObjectKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """The identity of one watched custom object, as last seen."""

    api_version: str  # e.g. "networking.serving.volcano.sh/v1alpha1"
    uid: str
    generation: int  # written back as status.observedGeneration / condition observedGeneration
    resource_version: str


@dataclass(frozen=True, slots=True)
class ClusterView:
    # The config built from every valid object (file mode's model). Objects in `problems`
    # are left out (or kept at their last good version: the watcher's choice, documented there).
    config: RouterConfig
    objects: Mapping[ObjectKey, ObjectMeta]
    # Objects the loader refused: the message names the field (config.errors.ConfigProblem text).
    problems: Mapping[ObjectKey, str] = field(default_factory=dict)
    # ModelServer (namespace, name) -> ready endpoint count by role: {"all": n} or, for a PD
    # server, {"all": n, "prefill": p, "decode": d}.
    # A PD server may add "pairs": prefill/decode groups with both roles ready (without
    # it, the status writer counts the server Ready when both roles have a ready endpoint).
    ready_endpoints: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)
    # Optional: the loader's ConfigProblems of each object in `problems`. Their `reason`
    # (BackendNotFound, CredentialNotFound, ...) gives finer status conditions
    # (ResolvedRefs, CredentialsResolved) than the message alone (then: reason Invalid).
    problem_details: Mapping[ObjectKey, tuple[ConfigProblem, ...]] = field(default_factory=dict)
