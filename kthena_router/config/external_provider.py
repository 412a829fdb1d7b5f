"""Typed model of Kthena's ExternalModelProvider (networking.serving.volcano.sh/v1alpha1).

A ModelRoute target with ``externalModelProviderName`` sends requests to a third-party
OpenAI- or Anthropic-compatible API instead of pods: no scheduling, PD or LoRA; one
upstream, the provider's ``baseURL``. Built by config.external_provider_parse (file mode)
and, later, by the Kubernetes watcher from the same objects; code here trusts its inputs.

The credential is resolved when the config loads (a Secret document, or our
``router.kthena.io/credential-file`` / ``-env`` annotation) and kept with ``repr=False``,
so it never reaches a log line, a traceback or an error message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ANTHROPIC", "APIKEY", "BEARER", "OPENAI", "PROVIDER_PATHS", "ExternalProvider", "upstream_path"]

OPENAI = "OpenAI"
ANTHROPIC = "Anthropic"
BEARER = "Bearer"
APIKEY = "APIKey"

# The request paths each provider type serves (Kthena: providers/openai.go, anthropic.go).
PROVIDER_PATHS: dict[str, frozenset[str]] = {
    OPENAI: frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"}),
    ANTHROPIC: frozenset({"/v1/messages"}),
}
# The scheme a provider type uses when spec.auth.scheme is unset (Kthena's defaults).
DEFAULT_SCHEME = {OPENAI: BEARER, ANTHROPIC: APIKEY}


@dataclass(frozen=True, slots=True)
class ExternalProvider:
    namespace: str
    name: str
    provider_type: str  # OPENAI | ANTHROPIC
    model: str | None  # spec.model: overrides the body's "model" (None: the client's is kept)
    base_url: str  # as written (https://host[:port][/path])
    host: str  # the URL's host: an IP literal or a DNS name (resolved per worker)
    port: int
    base_path: str  # the URL's path without a trailing "/" ("" for none)
    insecure_skip_verify: bool  # spec.insecureSkipVerify: no certificate-chain or hostname check
    auth_scheme: str | None  # BEARER | APIKEY; None: no credential is sent (spec.auth absent)
    credential: str | None = field(default=None, repr=False)  # the resolved key; never logged
    credential_source: str = ""  # where the key came from ("Secret default/x key api-key"), for messages
    headers: dict[str, str] = field(default_factory=dict)  # spec.headers (non-sensitive, validated)
    creation_timestamp: datetime | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def label(self) -> str:
        """The `model_server` metric label (and access-log server) of requests to it."""
        return f"external:{self.namespace}/{self.name}"

    @property
    def host_port(self) -> str:
        """The `endpoint` metric label: the provider's authority."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def auth_header(self) -> tuple[bytes, bytes] | None:
        """The credential as an upstream header line's (name, value); None without one."""
        if self.credential is None or self.auth_scheme is None:
            return None
        if self.auth_scheme == BEARER:
            return (b"authorization", b"Bearer " + self.credential.encode("latin-1"))
        return (b"x-api-key", self.credential.encode("latin-1"))


def upstream_path(provider: ExternalProvider, path: str) -> str:
    """The upstream request path for a client path, as Kthena joins them.

    OpenAI type: a base URL with a path (``https://api.example.com/v1``,
    ``https://host/openai``) takes the request path without its ``/v1`` prefix
    (``/v1/chat/completions`` -> ``/v1/chat/completions``, ``/openai/chat/completions``);
    a bare host keeps it (``https://api.deepseek.com`` -> ``/v1/chat/completions``).
    Anthropic type: the ``/v1`` prefix is dropped only when the base path ends in ``/v1``
    (``https://host/anthropic`` -> ``/anthropic/v1/messages``).
    """
    base = provider.base_path
    if base and (provider.provider_type == OPENAI or base.endswith("/v1")):
        rest = path[3:] if path.startswith("/v1/") else path
        return base + rest
    return base + path
