"""A metric from a Prometheus server (`metricSources[name].prometheus`): an instant query
against `<serverURL>/api/v1/query`, as Kthena's fetchPrometheusMetric. The result must be a
scalar or a vector of exactly one sample with a finite value; anything else is an error
(the metric then reads as missing this round). `auth` is not honoured (nor is it by Kthena).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import aiohttp

__all__ = ["PrometheusError", "parse_response", "query"]

log = logging.getLogger(__name__)


class PrometheusError(Exception):
    pass


def parse_response(body: Any) -> float:
    """The value of an /api/v1/query response document."""
    if not isinstance(body, dict):
        raise PrometheusError("response is not a JSON object")
    if body.get("status") != "success":
        raise PrometheusError(f"query failed: {body.get('errorType', '')} {body.get('error', body.get('status'))}"
                              .strip())
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        sample = result
    elif kind == "vector":
        if not isinstance(result, list) or len(result) != 1:
            raise PrometheusError(f"query must return a single sample vector, got {len(result or [])} samples")
        sample = (result[0] or {}).get("value")
    else:
        raise PrometheusError(f"unsupported result type {kind!r}")
    if not isinstance(sample, list) or len(sample) != 2:
        raise PrometheusError(f"malformed sample {sample!r}")
    try:
        value = float(sample[1])
    except (TypeError, ValueError):
        raise PrometheusError(f"malformed sample value {sample[1]!r}") from None
    if not math.isfinite(value):
        raise PrometheusError(f"non-finite value {sample[1]}")
    return value


async def query(session: aiohttp.ClientSession, server_url: str, promql: str,
                timeout: aiohttp.ClientTimeout) -> float:
    if not server_url.startswith(("http://", "https://")):
        raise PrometheusError(f"unsupported serverURL scheme (must be http/https): {server_url!r}")
    url = server_url.rstrip("/") + "/api/v1/query"
    try:
        async with session.get(url, params={"query": promql}, timeout=timeout) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                raise PrometheusError(f"{url}: HTTP {resp.status}, body is not JSON") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise PrometheusError(f"{url}: {type(exc).__name__}: {exc}") from None
    for w in (body.get("warnings") or []) if isinstance(body, dict) else []:
        log.warning("prometheus query %r warning: %s", promql, w)
    return parse_response(body)
