"""One Endpoints document (our kind: the engine addresses of file mode) -> EndpointSet."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from .checks import Ctx, check_int, check_labels, check_list, check_mapping, check_str
from .metadata import ObjectMeta
from .model import Endpoint, EndpointSet

__all__ = ["parse_endpoint_set", "valid_address"]

_HOSTNAME = re.compile(
    r"^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def valid_address(addr: str) -> bool:
    """An IP address or a DNS name (no scheme, no port)."""
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(addr)) and not addr.replace(".", "").isdigit()


def parse_endpoint_set(c: Ctx, meta: ObjectMeta, v: Any) -> EndpointSet | None:
    spec = check_mapping(c, v, "spec", ("endpoints",), required=("endpoints",))
    if spec is None:
        return None
    before = len(c.problems)
    out: list[Endpoint] = []
    for i, e in enumerate(check_list(c, spec.get("endpoints"), "spec.endpoints")):
        p = f"spec.endpoints[{i}]"
        m = check_mapping(c, e, p, ("address", "port", "labels", "bootstrapPort"), required=("address",))
        if m is None:
            continue
        addr = check_str(c, m.get("address"), p + ".address")
        if addr is not None and not valid_address(addr):
            c.err(p + ".address", f"must be an IP address or DNS name without scheme or port, got {addr!r}")
            addr = None
        port = check_int(c, m.get("port"), p + ".port", 1, 65535)
        labels = check_labels(c, m.get("labels"), p + ".labels")
        bootstrap = check_int(c, m.get("bootstrapPort"), p + ".bootstrapPort", 1, 65535)
        if addr is not None:
            out.append(Endpoint(address=addr, port=port, labels=labels, bootstrap_port=bootstrap))
    if len(c.problems) > before:
        return None
    return EndpointSet(namespace=meta.namespace, name=meta.name, endpoints=tuple(out))
