"""The router configuration's `externalProviders` section (ours, not Kthena's).

Kthena's ExternalModelProvider CRD is never extended; what the router needs beyond it
lives in the router configuration (--router-config), with per-provider overrides keyed
by name, as `traffic.modelServers`:

    externalProviders:
      caFile: /etc/kthena/provider-ca.pem   # trust store for provider certificates (PEM bundle);
                                            # absent: the system's CA store
      timeouts: {response: 120s, firstToken: 60s}   # over traffic.timeouts (same keys)
      retry: {attempts: 0, retryInterval: 100ms}    # same provider again, before the first byte only
      providers:                    # key "name" (namespace default) or "namespace/name"
        openai-main: {caFile: ..., timeouts: {idle: 300s}, retry: {attempts: 1}}

A caFile *replaces* the system store for the providers it applies to (a private CA does
not make every public CA trusted, nor the reverse). Relative paths are relative to the
router configuration file. The bundle is read and checked when the file loads; a reload
re-reads it. `spec.insecureSkipVerify` of a provider turns verification off whatever this
section says. Unknown fields are errors.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .checks import check_duration, check_int, check_mapping, check_str, join_path, named_overrides
from .traffic import _TIMEOUT_KEYS, Collector, Timeouts, _struct  # the traffic section's value rules

__all__ = ["DEFAULT_PROVIDER_SETTINGS", "ExternalProvidersSettings", "ProviderSettings", "parse_external_providers"]

_KEYS = ("caFile", "timeouts", "retry")
MAX_RETRY_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """Effective settings of one provider (the section's defaults with its override applied)."""

    ca_file: str | None = None  # the bundle's path (for messages)
    ca_pem: str | None = field(default=None, repr=False)  # its content; None: the system store
    # timeouts set here, as (Timeouts field, value) pairs applied over traffic.timeouts
    timeouts: tuple[tuple[str, Any], ...] = ()
    retry_attempts: int = 0  # further attempts on the same provider before the first byte
    retry_interval_s: float = 0.1

    def effective_timeouts(self, base: Timeouts) -> Timeouts:
        return dataclasses.replace(base, **dict(self.timeouts)) if self.timeouts else base


@dataclass(frozen=True, slots=True)
class ExternalProvidersSettings:
    defaults: ProviderSettings = field(default_factory=ProviderSettings)
    overrides: Mapping[str, ProviderSettings] = field(default_factory=lambda: MappingProxyType({}))

    def for_provider(self, namespace: str, name: str) -> ProviderSettings:
        return self.overrides.get(f"{namespace}/{name}", self.defaults)


DEFAULT_PROVIDER_SETTINGS = ExternalProvidersSettings()


def parse_external_providers(c: Collector, v: Any, base_dir: Path,
                             path: str = "externalProviders") -> ExternalProvidersSettings:
    """Validate the section; problems go to `c` (the result then holds defaults)."""
    if v is None:
        return DEFAULT_PROVIDER_SETTINGS
    m = check_mapping(c, v, path, _KEYS + ("providers",))
    if m is None:
        return DEFAULT_PROVIDER_SETTINGS
    defaults = _settings(c, ProviderSettings(), m, path, base_dir)
    overrides: dict[str, ProviderSettings] = {}
    for key, p, item in named_overrides(c, m.get("providers"), join_path(path, "providers"), "ExternalModelProvider"):
        if check_mapping(c, item, p, _KEYS) is not None:
            overrides[key] = _settings(c, defaults, item, p, base_dir)
    return ExternalProvidersSettings(defaults, MappingProxyType(overrides))


def _settings(c: Collector, base: ProviderSettings, m: Mapping[str, Any], path: str,
              base_dir: Path) -> ProviderSettings:
    out = base
    if m.get("caFile") is not None:
        ca = _ca_file(c, m["caFile"], join_path(path, "caFile"), base_dir)
        if ca is not None:
            out = dataclasses.replace(out, ca_file=ca[0], ca_pem=ca[1])
    if m.get("timeouts") is not None:
        tp = join_path(path, "timeouts")
        merged, present = _struct(c, out.effective_timeouts(Timeouts()), m["timeouts"], tp, _TIMEOUT_KEYS)
        changes = dict(out.timeouts)
        for key in present:
            attr = _TIMEOUT_KEYS[key][0]
            changes[attr] = getattr(merged, attr)
        out = dataclasses.replace(out, timeouts=tuple(sorted(changes.items())))
    if m.get("retry") is not None:
        rp = join_path(path, "retry")
        r = check_mapping(c, m["retry"], rp, ("attempts", "retryInterval"))
        if r is not None:
            attempts = check_int(c, r.get("attempts"), join_path(rp, "attempts"), 0, MAX_RETRY_ATTEMPTS)
            interval = check_duration(c, r.get("retryInterval"), join_path(rp, "retryInterval"))
            out = dataclasses.replace(
                out, retry_attempts=out.retry_attempts if attempts is None else attempts,
                retry_interval_s=out.retry_interval_s if interval is None else interval)
    return out


def _ca_file(c: Collector, v: Any, path: str, base_dir: Path) -> tuple[str, str] | None:
    name = check_str(c, v, path)
    if name is None:
        return None
    full = Path(name) if os.path.isabs(name) else base_dir / name
    try:
        pem = full.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        c.err(path, f"cannot read CA bundle {str(full)!r}: {getattr(e, 'strerror', None) or type(e).__name__}")
        return None
    try:
        ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, ValueError) as e:
        c.err(path, f"{str(full)!r} is not a PEM CA bundle: {e}")
        return None
    if "BEGIN CERTIFICATE" not in pem:
        c.err(path, f"{str(full)!r} holds no certificate")
        return None
    return str(full), pem
