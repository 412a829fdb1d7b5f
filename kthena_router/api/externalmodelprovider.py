"""ExternalModelProvider (networking.serving.volcano.sh/v1alpha1): a third-party model API
that a ModelRoute target can name instead of a ModelServer."""

from __future__ import annotations

from .common import NETWORKING, VERSION, conditions, observed_generation
from .k8s_types import core
from .schema import AGE, Column, Kind, Rule, boolean, map_of, obj, opt, req, string

__all__ = ["AUTH_SCHEMES", "EXTERNAL_MODEL_PROVIDER", "PROVIDER_TYPES"]

PROVIDER_TYPES = ("OpenAI", "Anthropic")
AUTH_SCHEMES = ("Bearer", "APIKey")

SPEC = obj(
    "A third-party model API.",
    opt("providerType", string("The API protocol.", enum=PROVIDER_TYPES, default="OpenAI")),
    opt("model", string("Upstream model name; when set it replaces the request's \"model\".", max_length=256)),
    req("baseURL", string("The provider's HTTPS endpoint root, e.g. https://api.example.com.", min_length=1,
                          pattern=r"^https://.+")),
    opt("insecureSkipVerify", boolean("Skip verification of the provider's certificate (still HTTPS).",
                                      default=False)),
    opt("auth", obj(
        "The credential, from a Secret in the same namespace.",
        opt("scheme", string("How the credential is sent: Bearer (Authorization header) or APIKey (x-api-key); "
                             "the provider type's default when unset.", enum=AUTH_SCHEMES)),
        req("secretRef", core("SecretKeySelector", "The Secret and key holding the credential.")),
        rules=(Rule("!has(self.secretRef.optional) || !self.secretRef.optional",
                    "secretRef.optional must be false or unset"),),
    )),
    opt("headers", map_of(string(), "Static, non-secret headers added to upstream requests.")),
)

EXTERNAL_MODEL_PROVIDER = Kind(
    group=NETWORKING, version=VERSION, kind="ExternalModelProvider", plural="externalmodelproviders",
    description="ExternalModelProvider is a third-party model API that routes can send traffic to.",
    spec=SPEC,
    status=obj("Observed state, written by the router.",
               opt("observedGeneration", observed_generation()),
               opt("conditions", conditions("Ready and CredentialsResolved."))),
    columns=(Column("Provider", "string", ".spec.providerType", "API protocol"),
             Column("Base URL", "string", ".spec.baseURL", "Provider endpoint"),
             Column("Ready", "string", ".status.conditions[?(@.type=='Ready')].status", "Usable by the router"),
             AGE),
)
