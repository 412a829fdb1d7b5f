"""RouteTable: request model name + path + headers -> (route, rule, ModelServer, upstream model).

Built once per config (a reload builds a new table and swaps the reference, so
in-flight requests keep the objects they matched). ``match`` is on the hot path:
one dict lookup, then the rules' pre-compiled predicates, then one rng draw.

Behaviour follows Kthena's router (pkg/kthena-router/datastore/store.go):
- a name claimed as a ``modelName`` is looked up among modelName routes only; LoRA
  adapter routes are consulted only when no route has that modelName;
- routes claiming one name are tried in priority order (``route_priority``): the first
  route with a matching rule wins, so a lower-priority route serves what the winner's
  rules leave unmatched (as Kthena, which tries each candidate route);
- rules are tried in order, first match wins; an empty modelMatch matches everything;
- weighted targets are a traffic split (integer draw over the weight sum, weight 0
  never chosen); unweighted targets are an even split (Kthena counts each as weight 1).
  A target may be an ExternalModelProvider (an `ExternalMatch`), in the same split.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

from ..config.external_provider import ExternalProvider
from ..config.model import ModelRoute, ModelServer, RouteRule, RouterConfig, StringMatch, route_priority

__all__ = ["ExternalMatch", "RouteMatch", "RouteNotFound", "RouteTable"]


class RouteNotFound(Exception):
    """404: unknown model, or no rule of its routes matched the request."""

    status = 404
    code = "model_not_found"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class RouteMatch:
    route: ModelRoute
    rule: RouteRule
    server: ModelServer
    upstream_model: str  # value for the body's "model"
    is_lora: bool


@dataclass(frozen=True, slots=True)
class ExternalMatch:
    """A rule's target that is a third-party API (kthena_router.proxy.external)."""

    route: ModelRoute
    rule: RouteRule
    provider: ExternalProvider
    upstream_model: str | None  # spec.model override; None: the client's model goes as is


class _Rule:
    """A RouteRule with its predicates and prebuilt (non-LoRA) matches per target."""

    __slots__ = ("headers", "uri", "body_model", "cum", "total", "matches", "rule", "route")

    def __init__(self, route: ModelRoute, rule: RouteRule, cfg: RouterConfig):
        self.route = route
        self.rule = rule
        self.headers: tuple[tuple[str, StringMatch], ...] = tuple(rule.headers.items())
        self.uri = rule.uri
        self.body_model = rule.body_model
        ns = route.namespace
        matches: list[RouteMatch | ExternalMatch] = []
        for t in rule.targets:
            if t.model_server_name is not None:
                srv = cfg.servers[(ns, t.model_server_name)]
                matches.append(RouteMatch(route, rule, srv, srv.model or route.model_name or "", False))
            else:  # the loader checked that exactly one name is set and that it exists
                prov = cfg.providers[(ns, t.external_model_provider_name or "")]
                matches.append(ExternalMatch(route, rule, prov, prov.model))
        self.matches = tuple(matches)
        if rule.targets and rule.targets[0].weight is not None:
            cum, acc = [], 0
            for t in rule.targets:
                acc += t.weight or 0
                cum.append(acc)
            self.cum: list[int] | None = cum
            self.total = acc
        else:
            self.cum = None  # even split
            self.total = len(rule.targets)

    def holds(self, model: str, path: str, headers: Mapping[str, str]) -> bool:
        if self.body_model is not None and model != self.body_model:
            return False
        for name, sm in self.headers:
            if not sm.matches(headers.get(name)):
                return False
        return self.uri is None or self.uri.matches(path)

    def pick(self, rng: random.Random) -> int:
        n = len(self.matches)
        if n == 1:
            return 0
        if self.cum is None:
            return rng.randrange(n)
        return bisect_right(self.cum, rng.randrange(self.total))


class RouteTable:
    def __init__(self, by_model: dict[str, tuple[_Rule, ...]], by_lora: dict[str, tuple[_Rule, ...]],
                 names: list[tuple[str, bool]], config: RouterConfig | None = None):
        self._by_model = by_model
        self._by_lora = by_lora
        self._names = names
        self.config = config

    @classmethod
    def build(cls, cfg: RouterConfig) -> RouteTable:
        routes = sorted(cfg.routes, key=route_priority)
        by_model: dict[str, list[_Rule]] = {}
        by_lora: dict[str, list[_Rule]] = {}
        for route in routes:
            rules = [_Rule(route, rule, cfg) for rule in route.rules]
            if route.model_name:
                by_model.setdefault(route.model_name, []).extend(rules)
            for adapter in route.lora_adapters:
                if adapter != route.model_name:
                    by_lora.setdefault(adapter, []).extend(rules)
        # /v1/models lists names in source order; a modelName shadows an equal adapter name.
        names: list[tuple[str, bool]] = []
        seen: set[str] = set()
        for route in cfg.routes:
            if route.model_name and route.model_name not in seen:
                seen.add(route.model_name)
                names.append((route.model_name, False))
        for route in cfg.routes:
            for adapter in route.lora_adapters:
                if adapter not in seen:
                    seen.add(adapter)
                    names.append((adapter, True))
        return cls(
            {k: tuple(v) for k, v in by_model.items()},
            {k: tuple(v) for k, v in by_lora.items() if k not in by_model},
            names,
            cfg,
        )

    def model_names(self) -> list[tuple[str, bool]]:
        """(name, is_lora) for /v1/models, in source order, base models first."""
        return list(self._names)

    def first_rules(self) -> list[tuple[str, bool, _Rule]]:
        """(name, is_lora, the first rule tried) for every name the table serves."""
        out = [(name, False, rules[0]) for name, rules in self._by_model.items() if rules]
        return out + [(name, True, rules[0]) for name, rules in self._by_lora.items() if rules]

    def match(self, model: str, path: str, headers: Mapping[str, str],
              rng: random.Random) -> RouteMatch | ExternalMatch:
        """``headers`` must be keyed by lower-case names (or case-insensitive, as
        starlette's Headers). Raises RouteNotFound."""
        rules = self._by_model.get(model)
        is_lora = False
        if rules is None:
            rules = self._by_lora.get(model)
            if rules is None:
                raise RouteNotFound(f"The model `{model}` does not exist.")
            is_lora = True
        for r in rules:
            if r.holds(model, path, headers):
                m = r.matches[r.pick(rng)]
                if is_lora and type(m) is RouteMatch:  # (the loader keeps providers off LoRA routes)
                    # LoRA requests keep the adapter name: the engine serves it by that name.
                    return RouteMatch(m.route, m.rule, m.server, model, True)
                return m
        raise RouteNotFound(f"No route rule matches this request for model `{model}`.")
