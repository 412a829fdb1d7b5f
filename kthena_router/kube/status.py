"""The status the router writes on Kthena's objects, computed from a ClusterView (pure).

Kthena defines status only for ExternalModelProvider (`observedGeneration`, `conditions`
Ready and CredentialsResolved, with its reasons); its ModelRoute and ModelServer status
structs are empty. We write `status` only, never spec:

- ModelRoute: `Accepted` (True/Accepted; True/ModelNameConflict when an older route is
  tried first for a name it claims; False/Invalid; False/UnresolvedRefs) and `ResolvedRefs`
  (every targetModels[] names an existing, valid ModelServer / ExternalModelProvider;
  False/BackendNotFound).
- ModelServer: `Ready` (a ready endpoint, or for PD a prefill+decode pair) and
  `readyEndpoints` (+ `readyPrefillEndpoints` / `readyDecodeEndpoints` for PD).
- ExternalModelProvider: Kthena's `Ready` and `CredentialsResolved`, with Kthena's reasons.

Every status carries `observedGeneration`; each condition its own `observedGeneration`.
`merge_status` follows apimachinery's SetStatusCondition: lastTransitionTime changes only
when a condition's status flips; conditions of other types (another writer's) are kept.
docs/kubernetes-status.md describes every condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kthena_router.config.errors import (
    BACKEND_NOT_FOUND, CREDENTIAL_INVALID, CREDENTIAL_KEY_NOT_FOUND, CREDENTIAL_NOT_FOUND, ConfigProblem,
)
from kthena_router.config.model import RouteConflict

from .view import ClusterView, ObjectKey, ObjectMeta

__all__ = [
    "KINDS", "Condition", "DesiredStatus", "KindInfo", "desired_statuses", "format_time", "merge_status",
]

GROUP = "networking.serving.volcano.sh"
VERSION = "v1alpha1"


@dataclass(frozen=True, slots=True)
class KindInfo:
    group: str
    version: str
    plural: str


KINDS: dict[str, KindInfo] = {
    "ModelRoute": KindInfo(GROUP, VERSION, "modelroutes"),
    "ModelServer": KindInfo(GROUP, VERSION, "modelservers"),
    "ExternalModelProvider": KindInfo(GROUP, VERSION, "externalmodelproviders"),
}

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
_CREDENTIAL_REASONS = frozenset({CREDENTIAL_NOT_FOUND, CREDENTIAL_KEY_NOT_FOUND, CREDENTIAL_INVALID})
_MAX_MESSAGE = 4096  # metav1.Condition allows 32768; a few lines are enough for kubectl
# Status fields (besides conditions/observedGeneration) the router owns, per kind: set or removed.
_OWNED_FIELDS: dict[str, frozenset[str]] = {
    "ModelRoute": frozenset(),
    "ModelServer": frozenset({"readyEndpoints", "readyPrefillEndpoints", "readyDecodeEndpoints"}),
    "ExternalModelProvider": frozenset(),
}


@dataclass(frozen=True, slots=True)
class Condition:
    """A metav1.Condition without lastTransitionTime (merge_status keeps or sets it)."""

    type: str
    status: str  # True | False | Unknown
    reason: str  # CamelCase
    message: str


@dataclass(frozen=True, slots=True)
class DesiredStatus:
    kind: str
    namespace: str
    name: str
    meta: ObjectMeta
    conditions: tuple[Condition, ...]
    fields: Mapping[str, Any] = field(default_factory=dict)  # owned status fields to set

    @property
    def key(self) -> ObjectKey:
        return (self.kind, self.namespace, self.name)


def format_time(t: datetime) -> str:
    """metav1.Time: RFC 3339, UTC, whole seconds."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def desired_statuses(view: ClusterView) -> dict[ObjectKey, DesiredStatus]:
    """The status each watched object should have (objects of other kinds are left out)."""
    routes = {(r.namespace, r.name) for r in view.config.routes}
    conflicts: dict[tuple[str, str], list[RouteConflict]] = {}
    for c in view.config.route_conflicts:
        conflicts.setdefault((c.namespace, c.name), []).append(c)
    out: dict[ObjectKey, DesiredStatus] = {}
    for key, meta in view.objects.items():
        kind, ns, name = key
        if kind == "ModelRoute":
            conds = _route(view, key, (ns, name) in routes, conflicts.get((ns, name), []))
            out[key] = DesiredStatus(kind, ns, name, meta, conds)
        elif kind == "ModelServer":
            conds, fields = _server(view, key)
            out[key] = DesiredStatus(kind, ns, name, meta, conds, fields)
        elif kind == "ExternalModelProvider":
            out[key] = DesiredStatus(kind, ns, name, meta, _provider(view, key))
    return out


def _text(p: ConfigProblem) -> str:
    return f"{p.field}: {p.message}" if p.field else p.message


def _join(lines: list[str]) -> str:
    msg = "; ".join(lines)
    return msg if len(msg) <= _MAX_MESSAGE else msg[: _MAX_MESSAGE - 3] + "..."


def _problems(view: ClusterView, key: ObjectKey) -> tuple[str, tuple[ConfigProblem, ...]]:
    return view.problems[key], tuple(view.problem_details.get(key, ()))


_PENDING = "not in the router's configuration yet"


def _route(view: ClusterView, key: ObjectKey, served: bool, conflicts: list[RouteConflict]) -> tuple[Condition, ...]:
    if key in view.problems:  # checked first: the watcher may keep serving a last good version
        message, details = _problems(view, key)
        refs = [p for p in details if p.reason == BACKEND_NOT_FOUND]
        others = [p for p in details if p.reason != BACKEND_NOT_FOUND]
        kept = " (the router keeps serving its last valid version)" if served else ""
        if refs:
            resolved = Condition("ResolvedRefs", FALSE, BACKEND_NOT_FOUND, _join([_text(p) for p in refs]))
        else:
            resolved = Condition("ResolvedRefs", UNKNOWN, "Invalid", "targets not checked: the route is invalid")
        if refs and not others:
            accepted = Condition("Accepted", FALSE, "UnresolvedRefs",
                                 "not served: a target does not exist (see ResolvedRefs)" + kept)
        else:
            accepted = Condition("Accepted", FALSE, "Invalid",
                                 _join([_text(p) for p in others] or [message]) + kept)
        return accepted, resolved
    if not served:
        return (Condition("Accepted", UNKNOWN, "Pending", _PENDING),
                Condition("ResolvedRefs", UNKNOWN, "Pending", _PENDING))
    if conflicts:
        lines = []
        for c in conflicts:
            what = "LoRA adapter" if c.lora else "model"
            owner = f"{c.owner[0]}/{c.owner[1]}"
            if c.shadowed:
                lines.append(f"{what} {c.claimed!r} is the modelName of ModelRoute {owner}: requests for it go there")
            else:
                lines.append(f"{what} {c.claimed!r} is also claimed by the older ModelRoute {owner}, tried first: "
                             "this route serves only requests whose rules that route leaves unmatched")
        accepted = Condition("Accepted", TRUE, "ModelNameConflict", _join(lines))
    else:
        accepted = Condition("Accepted", TRUE, "Accepted", "served by the router")
    return accepted, Condition("ResolvedRefs", TRUE, "ResolvedRefs", "every target exists")


def _server(view: ClusterView, key: ObjectKey) -> tuple[tuple[Condition, ...], dict[str, Any]]:
    _, ns, name = key
    counts = view.ready_endpoints.get((ns, name), {})
    server = view.config.servers.get((ns, name))
    pd = server.pd_group is not None if server is not None else ("prefill" in counts or "decode" in counts)
    n, p, d = counts.get("all", 0), counts.get("prefill", 0), counts.get("decode", 0)
    fields: dict[str, Any] = {"readyEndpoints": n}
    if pd:
        fields["readyPrefillEndpoints"] = p
        fields["readyDecodeEndpoints"] = d
    if key in view.problems:
        message, details = _problems(view, key)
        text = _join([_text(x) for x in details] or [message])
        return (Condition("Ready", FALSE, "Invalid", text),), fields
    if server is None:
        return (Condition("Ready", UNKNOWN, "Pending", _PENDING),), fields
    if pd:
        pairs = counts.get("pairs")
        ok = pairs > 0 if pairs is not None else (p > 0 and d > 0)
        roles = f"{p} prefill, {d} decode"
        if ok:
            return (Condition("Ready", TRUE, "EndpointsReady", f"{n} ready endpoints ({roles})"),), fields
        return (Condition("Ready", FALSE, "NoReadyPair",
                          f"no prefill/decode pair in one group is ready ({roles} ready endpoints)"),), fields
    if n > 0:
        return (Condition("Ready", TRUE, "EndpointsReady", f"{n} ready endpoint{'s' if n != 1 else ''}"),), fields
    return (Condition("Ready", FALSE, "NoReadyEndpoints",
                      f"no ready endpoint matches workloadSelector.matchLabels {server.match_labels}"),), fields


def _provider(view: ClusterView, key: ObjectKey) -> tuple[Condition, ...]:
    """Kthena's conditions and reasons (pkg/kthena-router/controller/externalmodelprovider_controller.go)."""
    _, ns, name = key
    if key in view.problems:
        message, details = _problems(view, key)
        cred = [p for p in details if p.reason in _CREDENTIAL_REASONS]
        others = [p for p in details if p.reason not in _CREDENTIAL_REASONS]
        if cred:
            credential = Condition("CredentialsResolved", FALSE, cred[0].reason, _join([_text(p) for p in cred]))
        else:
            credential = Condition("CredentialsResolved", UNKNOWN, "ConfigurationInvalid",
                                   "credential not checked: the provider is invalid")
        if others or not cred:
            ready = Condition("Ready", FALSE, "ConfigurationInvalid", _join([_text(p) for p in others] or [message]))
        else:
            ready = Condition("Ready", FALSE, credential.reason, credential.message)
        return credential, ready
    prov = view.config.providers.get((ns, name))
    if prov is None:
        return (Condition("CredentialsResolved", UNKNOWN, "Pending", _PENDING),
                Condition("Ready", UNKNOWN, "Pending", _PENDING))
    if prov.credential is None:
        credential = Condition("CredentialsResolved", TRUE, "CredentialNotRequired", "No credential is configured")
    else:
        credential = Condition("CredentialsResolved", TRUE, "CredentialResolved",
                               f"credential available ({prov.credential_source})")
    return credential, Condition("Ready", TRUE, "Ready", "External provider configuration is ready")


def merge_status(current: Mapping[str, Any] | None, desired: DesiredStatus, now: str) -> dict[str, Any]:
    """`current` with the desired conditions and fields applied (a new dict).

    lastTransitionTime is kept while a condition's status is unchanged (reason, message and
    observedGeneration may change without a transition); `now` is used for new conditions
    and flips. Other status fields and conditions of other types are kept.
    """
    status: dict[str, Any] = dict(current or {})
    for f in _OWNED_FIELDS.get(desired.kind, ()):
        status.pop(f, None)
    status.update(desired.fields)
    gen = desired.meta.generation
    status["observedGeneration"] = gen
    old = status.get("conditions")
    conds: list[dict[str, Any]] = [c for c in old if isinstance(c, dict)] if isinstance(old, list) else []
    for want in desired.conditions:
        idx = [i for i, c in enumerate(conds) if c.get("type") == want.type]
        prev = conds[idx[0]] if idx else None
        ltt = prev.get("lastTransitionTime") if prev is not None and prev.get("status") == want.status else None
        new = {"type": want.type, "status": want.status, "reason": want.reason, "message": want.message,
               "observedGeneration": gen, "lastTransitionTime": ltt if isinstance(ltt, str) and ltt else now}
        if idx:
            conds[idx[0]] = new
            for i in reversed(idx[1:]):  # duplicates of a type are invalid: keep the first
                del conds[i]
        else:
            conds.append(new)
    status["conditions"] = conds
    return status
