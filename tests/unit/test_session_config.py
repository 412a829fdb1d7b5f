"""sessionSticky: the route-level block (Kthena's proposal) and the router configuration's store."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_fixtures import endpoints, load, route, server

from kthena_router.config import ConfigError
from kthena_router.config.model import SessionKeySource, SessionSticky
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.session.config import RedisStoreSettings, StickySettings

ROUTE_DOC = "document 1 (ModelRoute default/r)"


def _route_with(tmp_path: Path, sticky: object):
    r = route()
    r["spec"]["sessionSticky"] = sticky
    return load(tmp_path, [r, server(), endpoints()])


def test_route_session_sticky_is_parsed_with_kthena_defaults(tmp_path: Path) -> None:
    cfg = _route_with(tmp_path, {"sources": [{"type": "Header", "name": "X-Session-ID"},
                                             {"type": "Query", "name": "Session"},
                                             {"type": "Cookie", "name": "SID"},
                                             {"type": "JWTClaim", "name": "sub"}]})
    assert cfg.routes[0].session_sticky == SessionSticky(
        (SessionKeySource("Header", "x-session-id"), SessionKeySource("Query", "Session"),
         SessionKeySource("Cookie", "SID"), SessionKeySource("JWTClaim", "sub")), 10800)
    cfg = _route_with(tmp_path, {"sources": [{"type": "Header", "name": "x"}], "sessionAffinitySeconds": 5})
    assert cfg.routes[0].session_sticky.affinity_seconds == 5
    assert load(tmp_path, [route(), server(), endpoints()]).routes[0].session_sticky is None


@pytest.mark.parametrize("sticky,field,words", [
    ({}, "spec.sessionSticky.sources", "at least one source"),
    ({"sources": []}, "spec.sessionSticky.sources", "at least one source"),
    ({"sources": [{"type": "Body", "name": "x"}]}, "spec.sessionSticky.sources[0].type", "must be one of Header"),
    ({"sources": [{"type": "Header"}]}, "spec.sessionSticky.sources[0].name", "required"),
    ({"sources": [{"type": "Header", "name": ""}]}, "spec.sessionSticky.sources[0].name", "must not be empty"),
    ({"sources": [{"type": "Header", "name": "x", "kind": 1}]}, "spec.sessionSticky.sources[0].kind", "unknown field"),
    ({"sources": [{"type": "Header", "name": "x"}], "sessionAffinitySeconds": 0},
     "spec.sessionSticky.sessionAffinitySeconds", "between 1 and"),
    ({"sources": [{"type": "Header", "name": "x"}], "ttl": 3}, "spec.sessionSticky.ttl", "unknown field"),
    ({"sources": [{"type": "Header", "name": f"h{i}"} for i in range(17)]}, "spec.sessionSticky.sources",
     "at most 16"),
    ("x-session", "spec.sessionSticky", "must be a mapping"),
])
def test_route_session_sticky_errors_name_file_document_and_field(tmp_path: Path, sticky, field, words) -> None:
    with pytest.raises(ConfigError) as ei:
        _route_with(tmp_path, sticky)
    err = ei.value
    assert err.file.endswith("config.yaml")
    assert (err.document, err.field) == (ROUTE_DOC, field), str(err)
    assert words in err.message


def _rc(text: str, tmp_path: Path):
    (tmp_path / "router.yaml").write_text(text)
    return load_router_configuration_bytes(text, str(tmp_path / "router.yaml"), tmp_path)


def test_router_configuration_store_settings(tmp_path: Path) -> None:
    assert _rc("sessionSticky: {backend: memory, maxEntries: 1000}\n", tmp_path).session_sticky == \
        StickySettings("memory", 1000, None)
    rc = _rc("sessionSticky:\n  backend: redis\n  redis: {address: 'redis.kthena:6380', db: 2, timeout: 20ms,"
             " retryAfter: 3s, keyPrefix: 'p:'}\n", tmp_path)
    assert rc.session_sticky == StickySettings("redis", 100_000, RedisStoreSettings(
        "redis.kthena", 6380, None, 2, "p:", 0.02, 3.0))
    assert _rc("sessionSticky: {backend: redis, redis: {address: '[::1]:6379'}}\n", tmp_path) \
        .session_sticky.redis.host == "::1"


@pytest.mark.parametrize("text,field,words", [
    ("sessionSticky: {backend: redis, redis: {address: redis}}\n", "sessionSticky.redis.address", "host:port"),
    ("sessionSticky: {backend: redis, redis: {address: 'r:99999'}}\n", "sessionSticky.redis.address", "host:port"),
    ("sessionSticky: {backend: redis, redis: {}}\n", "sessionSticky.redis.address", "required"),
    ("sessionSticky: {backend: redis, redis: {address: 'r:1', timeout: 0s}}\n", "sessionSticky.redis.timeout",
     "more than 0"),
    ("sessionSticky: {backend: redis, redis: {address: 'r:1', pasword: x}}\n", "sessionSticky.redis.pasword",
     "did you mean 'password'"),
    ("sessionSticky: {backend: redis, maxEntries: 1000, redis: {address: 'r:1'}}\n", "sessionSticky.maxEntries",
     "backend: memory only"),
    ("sessionSticky: {backend: memory, redis: {address: 'r:1'}}\n", "sessionSticky.redis", "only used with backend"),
    ("sessionSticky: {redis: {address: 'r:1'}}\n", "sessionSticky.redis", "only used with backend"),
    ("sessionSticky: {maxEntries: 1}\n", "sessionSticky.maxEntries", "between 16 and"),
])
def test_router_configuration_store_errors(tmp_path: Path, text, field, words) -> None:
    with pytest.raises(ConfigError) as ei:
        _rc(text, tmp_path)
    err = ei.value
    assert (err.file, err.document, err.field) == (str(tmp_path / "router.yaml"), "document 1", field), str(err)
    assert words in err.message


def test_router_configuration_per_route_overrides(tmp_path: Path) -> None:
    from kthena_router.config.model import ModelRoute

    rc = _rc("sessionSticky:\n  routes:\n"
             "    team-a/chat: {sources: [{type: Header, name: X-Session-ID}], sessionAffinitySeconds: 60}\n"
             "    chat: {sources: [{type: Cookie, name: sid}]}\n", tmp_path)
    s = rc.session_sticky
    assert s.backend == "memory" and set(s.routes) == {"team-a/chat", "chat"}
    assert s.routes["team-a/chat"] == SessionSticky((SessionKeySource("Header", "x-session-id"),), 60)

    def r(ns: str, name: str, own: SessionSticky | None = None) -> ModelRoute:
        return ModelRoute(ns, name, "m", (), (), None, None, 0, session_sticky=own)

    own = SessionSticky((SessionKeySource("Query", "s"),), 5)
    assert s.for_route(r("team-a", "chat", own)) == s.routes["team-a/chat"]  # namespace/name first
    assert s.for_route(r("team-b", "chat", own)) == s.routes["chat"]  # then the name in any namespace
    assert s.for_route(r("team-a", "other", own)) is own  # else the route's own
    assert s.for_route(r("team-a", "other")) is None
    # the store is built from backend/maxEntries/redis only: a change of routes keeps the pins
    assert s.store_key == StickySettings().store_key


@pytest.mark.parametrize("text,field,words", [
    ("sessionSticky: {routes: [chat]}\n", "sessionSticky.routes", "must be a mapping"),
    ("sessionSticky: {routes: {'Team/Chat': {sources: [{type: Header, name: x}]}}}\n",
     "sessionSticky.routes['Team/Chat']", "namespace/name"),
    ("sessionSticky: {routes: {'a/b/c': {sources: [{type: Header, name: x}]}}}\n",
     "sessionSticky.routes['a/b/c']", "namespace/name"),
    ("sessionSticky: {routes: {chat: null}}\n", "sessionSticky.routes['chat']", "needs sources"),
    ("sessionSticky: {routes: {chat: {}}}\n", "sessionSticky.routes['chat'].sources", "at least one source"),
    ("sessionSticky: {routes: {chat: {sources: [{type: Body, name: x}]}}}\n",
     "sessionSticky.routes['chat'].sources[0].type", "must be one of Header"),
    ("sessionSticky: {routes: {chat: {sources: [{type: Header, name: x}], sessionAffinitySeconds: 0}}}\n",
     "sessionSticky.routes['chat'].sessionAffinitySeconds", "between 1 and"),
    ("sessionSticky: {routes: {chat: {sources: [{type: Header, name: x}], enabled: true}}}\n",
     "sessionSticky.routes['chat'].enabled", "unknown field"),
])
def test_router_configuration_per_route_errors(tmp_path: Path, text, field, words) -> None:
    with pytest.raises(ConfigError) as ei:
        _rc(text, tmp_path)
    err = ei.value
    assert (err.file, err.document, err.field) == (str(tmp_path / "router.yaml"), "document 1", field), str(err)
    assert words in err.message
