"""One ModelServer document (Kthena's CRD rules, plus our router.kthena.io/ annotations)
-> ModelServer."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checks import (
    Ctx,
    check_duration,
    check_enum,
    check_int,
    check_labels,
    check_mapping,
    check_str,
    join_path,
)
from ..api.modelserver import INFERENCE_ENGINES, KV_CONNECTORS, PROTOCOLS
from .metadata import ObjectMeta
from .model import DEFAULT_PORT, ModelServer, PDGroup

__all__ = ["ANN_PREFIX", "ANN_TLS_SKIP", "ANN_TOKEN_ENV", "ANN_TOKEN_FILE", "parse_model_server"]

ANN_PREFIX = "router.kthena.io/"
ANN_TOKEN_FILE = ANN_PREFIX + "upstream-token-file"
ANN_TOKEN_ENV = ANN_PREFIX + "upstream-token-env"
ANN_TLS_SKIP = ANN_PREFIX + "tls-insecure-skip-verify"
_ANNOTATIONS = (ANN_TOKEN_FILE, ANN_TOKEN_ENV, ANN_TLS_SKIP)

# enums from the API declarations (kthena_router/api), the source of the CRD too
_ENGINES = INFERENCE_ENGINES
_PROTOCOLS = PROTOCOLS
_KV_CONNECTORS = KV_CONNECTORS


def parse_model_server(c: Ctx, meta: ObjectMeta, v: Any, base_dir: Path) -> ModelServer | None:
    """``base_dir`` resolves a relative upstream-token-file path."""
    spec = check_mapping(
        c, v, "spec",
        ("model", "inferenceEngine", "workloadSelector", "workloadPort", "trafficPolicy", "kvConnector"),
        required=("inferenceEngine", "workloadSelector"),
    )
    if spec is None:
        return None
    before = len(c.problems)
    model = check_str(c, spec.get("model"), "spec.model")
    if model is not None and len(model) > 256:
        c.err("spec.model", "at most 256 characters")
    engine = check_enum(c, spec.get("inferenceEngine"), "spec.inferenceEngine", _ENGINES)
    match_labels: dict[str, str] = {}
    pd_group: PDGroup | None = None
    if spec.get("workloadSelector") is not None:
        ws = check_mapping(c, spec["workloadSelector"], "spec.workloadSelector", ("matchLabels", "pdGroup"))
        if ws is not None:
            match_labels = check_labels(c, ws.get("matchLabels"), "spec.workloadSelector.matchLabels")
            if ws.get("pdGroup") is not None:
                pd_group = _pd_group(c, ws["pdGroup"], "spec.workloadSelector.pdGroup")
    port, protocol = DEFAULT_PORT, "http"
    if spec.get("workloadPort") is not None:
        wp = check_mapping(c, spec["workloadPort"], "spec.workloadPort", ("port", "protocol"), required=("port",))
        if wp is not None:
            port = check_int(c, wp.get("port"), "spec.workloadPort.port", 1, 65535) or port
            if wp.get("protocol") is not None:
                protocol = check_enum(c, wp["protocol"], "spec.workloadPort.protocol", _PROTOCOLS) or protocol
    timeout_s: float | None = None
    attempts: int | None = None  # None: no retry policy given (router default applies)
    interval = 0.1
    if spec.get("trafficPolicy") is not None:
        tp = check_mapping(c, spec["trafficPolicy"], "spec.trafficPolicy", ("timeout", "retry"))
        if tp is not None:
            timeout_s = check_duration(c, tp.get("timeout"), "spec.trafficPolicy.timeout")
            if tp.get("retry") is not None:
                rp = "spec.trafficPolicy.retry"
                r = check_mapping(c, tp["retry"], rp, ("attempts", "retryInterval"))
                if r is not None:
                    attempts = check_int(c, r.get("attempts"), rp + ".attempts", 0)
                    iv = check_duration(c, r.get("retryInterval"), rp + ".retryInterval")
                    interval = interval if iv is None else iv
    kv: str | None = None
    if spec.get("kvConnector") is not None:
        kp = "spec.kvConnector"
        k = check_mapping(c, spec["kvConnector"], kp, ("type",))
        if k is not None:
            kv = "http" if k.get("type") is None else check_enum(c, k["type"], kp + ".type", _KV_CONNECTORS)
        if engine == "SGLang":  # accepted and ignored otherwise: SGLang pairs by bootstrap rooms
            c.err(kp, "SGLang engines transfer KV with their bootstrap protocol; kvConnector applies "
                      "to vLLM servers only (remove it)")
    if kv is not None and pd_group is None and engine != "SGLang":
        c.err("spec.kvConnector", "kvConnector takes effect only with workloadSelector.pdGroup "
                                  "(prefill/decode pairs); add pdGroup or remove kvConnector")
    headers, skip_verify = _annotations(c, meta.annotations, base_dir)
    if len(c.problems) > before or engine is None:
        return None
    return ModelServer(
        namespace=meta.namespace,
        name=meta.name,
        model=model,
        inference_engine=engine,
        match_labels=match_labels,
        pd_group=pd_group,
        port=port,
        protocol=protocol,
        timeout_s=timeout_s,
        retry_attempts=attempts,
        retry_interval_s=interval,
        upstream_headers=headers,
        tls_insecure_skip_verify=skip_verify,
        kv_connector=kv,
        creation_timestamp=meta.creation_timestamp,
    )


def _pd_group(c: Ctx, v: Any, path: str) -> PDGroup | None:
    """Shape check of pdGroup (Kthena's CRD rules)."""
    pg = check_mapping(c, v, path, ("groupKey", "prefillLabels", "decodeLabels"),
                       required=("groupKey", "prefillLabels", "decodeLabels"))
    if pg is None:
        return None
    gk = check_str(c, pg.get("groupKey"), path + ".groupKey")
    return PDGroup(
        group_key=gk or "",
        prefill_labels=check_labels(c, pg.get("prefillLabels"), path + ".prefillLabels"),
        decode_labels=check_labels(c, pg.get("decodeLabels"), path + ".decodeLabels"),
    )


def _annotations(c: Ctx, ann: Mapping[str, str], base_dir: Path) -> tuple[dict[str, str], bool]:
    for k in ann:
        if k.startswith(ANN_PREFIX) and k not in _ANNOTATIONS:
            hint = difflib.get_close_matches(k, _ANNOTATIONS, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(_ANNOTATIONS)})"
            c.err(join_path("metadata.annotations", k), f"unknown router annotation{extra}")
    token: str | None = None
    f_path, env = ann.get(ANN_TOKEN_FILE), ann.get(ANN_TOKEN_ENV)
    if f_path is not None and env is not None:
        c.err(join_path("metadata.annotations", ANN_TOKEN_ENV), f"set only one of {ANN_TOKEN_FILE} and {ANN_TOKEN_ENV}")
    elif f_path is not None:
        p = join_path("metadata.annotations", ANN_TOKEN_FILE)
        full = Path(f_path) if os.path.isabs(f_path) else base_dir / f_path
        try:
            token = full.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            c.err(p, f"cannot read token file {str(full)!r}: {getattr(e, 'strerror', None) or e}")
        else:
            if not token:
                c.err(p, f"token file {str(full)!r} is empty")
                token = None
    elif env is not None:
        p = join_path("metadata.annotations", ANN_TOKEN_ENV)
        token = os.environ.get(env)
        if not token:
            c.err(p, f"environment variable {env!r} is not set or empty")
            token = None
    if token is not None and ("\n" in token or "\r" in token):
        c.err(join_path("metadata.annotations", ANN_TOKEN_FILE if f_path else ANN_TOKEN_ENV),
              "token must be a single line")
        token = None
    skip = False
    raw_skip = ann.get(ANN_TLS_SKIP)
    if raw_skip is not None:
        if raw_skip.lower() not in ("true", "false"):
            c.err(join_path("metadata.annotations", ANN_TLS_SKIP), f'must be "true" or "false", got {raw_skip!r}')
        skip = raw_skip.lower() == "true"
    return ({"Authorization": f"Bearer {token}"} if token else {}), skip
