"""configs/deploy/grafana/kthena-router.json queries only what the router exports.

The names and labels come from a real router's /metrics after traffic that touches every
panel (streams for TTFT/TPOT, prefix-cache scheduling, a failing engine for upstream errors
and retries, an unknown model, a saturated fair queue that queues and refuses), never from a
hard-coded list. Every metric a query names must be a sample name of that output (histogram
series as `_bucket`/`_sum`/`_count`), every label it matches on or groups by must be a label
of those samples, and an `le` it pins must be a bucket bound the router emits.
"""

from __future__ import annotations

import contextlib

import concurrent.futures
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

import harness

DASHBOARD = harness.REPO / "configs" / "deploy" / "grafana" / "kthena-router.json"
FUNCTIONS = {"sum", "min", "max", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "label_values",
             "clamp_min", "topk"}
KEYWORDS = {"by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right"}
# added by Prometheus at scrape time, not by the router
SCRAPE_LABELS = {"instance", "job", "pod", "namespace"}
ROUTER_CONFIG = """
scheduler:
  plugins:
    Filter: {enabled: [least-request]}
    Score:
      enabled:
        - {name: least-request, weight: 1}
        - {name: prefix-cache, weight: 1}
fairness:
  priorityClasses: [{name: default, maxQueueLength: 1}]
  saturation: {maxInFlight: 1}
"""


# --- a tiny PromQL reader (what the test needs: names, matchers, grouping labels) ----------

MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def read_expr(expr: str) -> tuple[dict[str, list[tuple[str, str, str]]], set[str]]:
    """({metric: [(label, op, value), ...]}, grouping labels) of one PromQL expression."""
    metrics: dict[str, list[tuple[str, str, str]]] = {}
    grouping: set[str] = set()
    text = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors ([$__rate_interval])
    for m in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        grouping |= {label.strip() for label in m.group(2).split(",") if label.strip()}
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    pos = 0
    token = re.compile(r'[A-Za-z_:][A-Za-z0-9_:]*|"(?:[^"\\]|\\.)*"|\{[^}]*\}|[0-9.]+(?:e-?[0-9]+)?|\S')
    last_metric: str | None = None
    for m in token.finditer(text, pos):
        tok = m.group(0)
        if tok.startswith("{"):
            assert last_metric is not None, f"matchers without a metric in {expr!r}"
            body = tok[1:-1]
            found = MATCHER.findall(body)
            assert MATCHER.sub("", body).replace(",", "").strip() == "", f"unreadable matchers {tok!r} in {expr!r}"
            metrics[last_metric].extend(found)
            last_metric = None
            continue
        last_metric = None
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok):
            following = text[m.end():].lstrip()[:1]
            if following == "(":
                assert tok in FUNCTIONS, f"unknown function {tok} in {expr!r}"
            elif tok in KEYWORDS:
                continue
            else:
                metrics.setdefault(tok, [])
                last_metric = tok
    return metrics, grouping


def test_reader_understands_the_shapes_the_dashboard_uses() -> None:
    metrics, grouping = read_expr(
        'histogram_quantile(0.9, sum by (le, model) (rate(a_bucket{model=~"$model", le="0.0"}[$__rate_interval])))'
        ' / sum(b_total) and on() c')
    assert metrics == {"a_bucket": [("model", "=~", "$model"), ("le", "=", "0.0")], "b_total": [], "c": []}
    assert grouping == {"le", "model"}
    with pytest.raises(AssertionError):
        read_expr("nosuchfunction(a)")


# --- the router's exported series --------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, str]]]]:
    """{sample name: [labels of each sample]} from a real router after varied traffic."""
    logs = tmp_path_factory.mktemp("grafana")
    sim = harness.start_simulator(logs, engines=3)
    router = None
    try:
        config = harness.write_config(logs / "routes.yaml", harness.engine_config(sim.ports, retry_attempts=3))
        rc = logs / "router-config.yaml"
        rc.write_text(ROUTER_CONFIG)
        router = harness.start_router(config, logs, extra_args=["--router-config", str(rc)])
        client = router.openai()
        prompt = "You are a helpful assistant. " * 40
        for i in range(4):  # streams: TTFT and TPOT; a shared prefix: prefix-cache hits
            stream = client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": f"{prompt} question {i}"}], max_tokens=8,
                stream=True, stream_options={"include_usage": True})
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        for e in range(3):  # every engine fails: upstream errors and retries whatever the ranking picks
            sim.set_faults(e, error_rate=1.0, error_status=500)
        for i in range(6):  # each ends in a 502 after its retries: the series exist
            with contextlib.suppress(openai.InternalServerError):
                client.chat.completions.create(model="demo", messages=[{"role": "user", "content": f"retry {i}"}],
                                               max_tokens=2)
        sim.reset_faults()
        with httpx.Client(timeout=30) as http:
            r = http.post(f"{router.openai_url}/chat/completions",
                          json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 404, r.text

            def slow(i: int) -> int:  # maxInFlight 1, queue of 1: one runs, one waits, the rest are refused
                return http.post(f"{router.openai_url}/chat/completions",
                                 json={"model": "demo", "max_tokens": 64,
                                       "messages": [{"role": "user", "content": f"long {i}"}]}).status_code

            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                codes = list(pool.map(slow, range(6)))
        assert 200 in codes and any(c != 200 for c in codes), codes
        families = harness.parse_metrics(router.metrics_text())
        samples: dict[str, list[dict[str, str]]] = {}
        for fam in families.values():
            for s in fam.samples:
                samples.setdefault(s.name, []).append(dict(s.labels))
        yield samples
    finally:
        if router is not None:
            router.stop()
        sim.stop()


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\(([A-Za-z_:][A-Za-z0-9_:]*),\s*([A-Za-z_][A-Za-z0-9_]*)\)",
                             var["query"]["query"])
            assert m, var
            out.append((f"variable {var['name']}", f"sum by ({m.group(2)}) ({m.group(1)})"))
    return out


def test_dashboard_is_valid_grafana_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("request rate", "first token", "per output token", "error", "per endpoint", "prefix", "queue"):
        assert topic in titles, topic
    for p in dash["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_every_query_names_exported_metrics_and_labels(exported: dict[str, list[dict[str, str]]]) -> None:
    queries = _dashboard_queries()
    assert len(queries) > 20
    problems = []
    for title, expr in queries:
        metrics, grouping = read_expr(expr)
        if not metrics:
            problems.append(f"{title}: names no metric: {expr}")
        labels_in_expr: set[str] = set()
        for name, matchers in metrics.items():
            if name not in exported:
                problems.append(f"{title}: {name} is not exported")
                continue
            labels = set().union(*(s.keys() for s in exported[name]))
            labels_in_expr |= labels
            for label, op, value in matchers:
                if label not in labels:
                    problems.append(f"{title}: {name} has no label {label} (has {sorted(labels)})")
                elif op == "=" and value and not value.startswith("$") and \
                        value not in {s.get(label) for s in exported[name]}:
                    problems.append(f"{title}: {name}{{{label}={value!r}}} matches no exported series")
        for label in grouping - labels_in_expr - SCRAPE_LABELS:
            problems.append(f"{title}: groups by {label}, which none of {sorted(metrics)} has")
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_wrong_name(exported: dict[str, list[dict[str, str]]]) -> None:
    """The same check refuses a typo'd metric, a histogram without its suffix and a wrong label."""
    for bad in ("rate(kthena_router_request_total[5m])",
                "rate(kthena_router_time_to_first_token_seconds[5m])",
                'sum by (pod_ip) (kthena_router_active_upstream_requests)'):
        metrics, grouping = read_expr(bad)
        names_ok = all(n in exported for n in metrics)
        labels = set().union(*(s.keys() for n in metrics if n in exported for s in exported[n]))
        assert not names_ok or not grouping <= labels | SCRAPE_LABELS, bad
