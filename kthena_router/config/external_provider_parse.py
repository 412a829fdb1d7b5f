"""ExternalModelProvider and Secret documents -> ExternalProvider (credential resolved).

Rules follow Kthena's CRD and its router's checks (pkg/apis/networking/v1alpha1/
externalmodelprovider_types.go, pkg/kthena-router/providers/adapter.go): baseURL is
https with a host and no userinfo, query or fragment; spec.headers may not set reserved
headers (credentials, framing, hop-by-hop); auth.secretRef names a Secret of the same
namespace carrying Kthena's credential label; the key is trimmed and must be a valid
header value. Where the key comes from, in this order of definition:

- a Secret document (apiVersion v1, kind Secret; ``data`` base64 and/or ``stringData``,
  stringData winning as in Kubernetes) named by ``spec.auth.secretRef``;
- our annotations ``router.kthena.io/credential-file`` (a path, relative to the config
  file) or ``router.kthena.io/credential-env``, as ModelServer's upstream-token-file/-env.
  They stand for the Secret in file mode (then no Secret document of that name may be in
  the file); without ``spec.auth`` the provider type's default scheme applies.

Messages never contain a key, a Secret value or a file's content.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..api.externalmodelprovider import EXTERNAL_MODEL_PROVIDER
from .checks import Ctx, check_enum, check_mapping, check_str, join_path, type_name
from .external_provider import ANTHROPIC, APIKEY, BEARER, DEFAULT_SCHEME, OPENAI, ExternalProvider
from .errors import CREDENTIAL_INVALID, CREDENTIAL_KEY_NOT_FOUND, CREDENTIAL_NOT_FOUND
from .metadata import ObjectMeta

__all__ = ["ANN_CREDENTIAL_ENV", "ANN_CREDENTIAL_FILE", "SECRET_LABEL", "PendingProvider", "SecretDoc",
           "parse_external_provider", "parse_secret", "resolve_credentials"]

ANN_PREFIX = "router.kthena.io/"
ANN_CREDENTIAL_FILE = ANN_PREFIX + "credential-file"
ANN_CREDENTIAL_ENV = ANN_PREFIX + "credential-env"
_ANNOTATIONS = (ANN_CREDENTIAL_FILE, ANN_CREDENTIAL_ENV)
# Kthena's router watches only Secrets with this label (labels.go).
SECRET_LABEL = ("networking.serving.volcano.sh/external-model-provider-credential", "true")

_SPEC_FIELDS = EXTERNAL_MODEL_PROVIDER.spec.known()  # from the API declarations, the source of the CRD too
_RESERVED_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", "x-api-key", "host", "content-length", "connection",
    "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "trailer", "te",
})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name


@dataclass(frozen=True, slots=True)
class SecretDoc:
    namespace: str
    name: str
    labelled: bool  # carries Kthena's credential label
    data: dict[str, bytes] = field(repr=False)  # data (decoded) updated with stringData


@dataclass
class PendingProvider:
    """A parsed provider whose credential the loader resolves once every Secret is known."""

    provider: ExternalProvider
    ctx: Ctx
    secret_ref: tuple[str, str] | None  # (name, key) of spec.auth.secretRef
    from_annotation: str | None = field(default=None, repr=False)  # key read from the annotation's file/env
    annotation: str = ""  # which annotation supplied it


def _valid_value(v: str) -> bool:
    """An HTTP field value: visible ASCII, space and tab (what our latin-1 header lines carry)."""
    return all(ch == "\t" or " " <= ch <= "~" for ch in v)


def _normalize_key(c: Ctx, raw: str, path: str, what: str, reason: str = "") -> str | None:
    key = raw.strip()
    if not key:
        c.err(path, f"{what} is empty (after trimming whitespace)", reason)
        return None
    if not _valid_value(key):
        c.err(path, f"{what} contains characters not allowed in an HTTP header (control or non-ASCII)", reason)
        return None
    return key


def parse_external_provider(c: Ctx, meta: ObjectMeta, v: Any, base_dir: Path) -> PendingProvider | None:
    spec = check_mapping(c, v, "spec", _SPEC_FIELDS, required=("baseURL",))
    if spec is None:
        return None
    before = len(c.problems)
    ptype = OPENAI if spec.get("providerType") is None else \
        check_enum(c, spec["providerType"], "spec.providerType", (OPENAI, ANTHROPIC))
    model = check_str(c, spec.get("model"), "spec.model", allow_empty=True) or None
    if model is not None and len(model) > 256:
        c.err("spec.model", "at most 256 characters")
    url = _base_url(c, spec.get("baseURL"))
    skip = spec.get("insecureSkipVerify", False)
    if skip is None:
        skip = False
    if not isinstance(skip, bool):
        c.err("spec.insecureSkipVerify", f"must be a boolean, got {type_name(skip)}")
    headers = _headers(c, spec.get("headers"))
    scheme: str | None = None
    ref: tuple[str, str] | None = None
    if spec.get("auth") is not None:
        scheme, ref = _auth(c, spec["auth"], ptype or OPENAI)
    ann_key, ann_name = _annotation_key(c, meta.annotations, base_dir)
    if ann_key is not None and scheme is None and ptype is not None:
        scheme = DEFAULT_SCHEME[ptype]
    if len(c.problems) > before or ptype is None or url is None:
        return None
    host, port, path = url
    provider = ExternalProvider(
        namespace=meta.namespace, name=meta.name, provider_type=ptype, model=model,
        base_url=spec["baseURL"], host=host, port=port, base_path=path, insecure_skip_verify=skip,
        auth_scheme=scheme, headers=headers, creation_timestamp=meta.creation_timestamp,
    )
    return PendingProvider(provider, c, ref, ann_key, ann_name)


def _base_url(c: Ctx, v: Any) -> tuple[str, int, str] | None:
    p = "spec.baseURL"
    s = check_str(c, v, p)
    if s is None:
        return None
    try:
        u = urlsplit(s)
        port = u.port
    except ValueError as exc:
        c.err(p, f"not a valid URL: {exc}")
        return None
    if u.scheme != "https" or not u.hostname:
        c.err(p, "must be an https:// URL with a host (external providers must use HTTPS; "
                 "insecureSkipVerify turns off certificate checks, not TLS)")
        return None
    if u.username is not None or u.password is not None or u.query or u.fragment or s.endswith(("?", "#")):
        c.err(p, "must not contain userinfo, a query or a fragment")
        return None
    return u.hostname, port or 443, u.path.rstrip("/")


def _headers(c: Ctx, v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        c.err("spec.headers", f"must be a mapping of header name to value, got {type_name(v)}")
        return {}
    out: dict[str, str] = {}
    for k, val in v.items():
        p = join_path("spec.headers", str(k))
        if not isinstance(k, str) or not _TOKEN.fullmatch(k):
            c.err(p, "not a valid HTTP header name")
        elif k.lower() in _RESERVED_HEADERS:
            c.err(p, "reserved header: the router sets it (credentials come from spec.auth)")
        elif k.lower() in out:
            c.err(p, "duplicate header name (header names are case-insensitive)")
        elif not isinstance(val, str) or not _valid_value(val):
            c.err(p, "value must be a string of visible ASCII characters")
        else:
            out[k.lower()] = val
    return out


def _auth(c: Ctx, v: Any, ptype: str) -> tuple[str | None, tuple[str, str] | None]:
    a = check_mapping(c, v, "spec.auth", ("scheme", "secretRef"), required=("secretRef",))
    if a is None:
        return None, None
    scheme = DEFAULT_SCHEME[ptype] if a.get("scheme") is None else \
        check_enum(c, a["scheme"], "spec.auth.scheme", (BEARER, APIKEY))
    ref = None
    if a.get("secretRef") is not None:
        rp = "spec.auth.secretRef"
        r = check_mapping(c, a["secretRef"], rp, ("name", "key", "optional"), required=("name", "key"))
        if r is not None:
            if r.get("optional") not in (None, False):
                c.err(join_path(rp, "optional"), "secretRef.optional must be false or unset")
            name = check_str(c, r.get("name"), join_path(rp, "name"))
            key = check_str(c, r.get("key"), join_path(rp, "key"))
            if name is not None and key is not None:
                ref = (name, key)
    return scheme, ref


def _annotation_key(c: Ctx, ann: Mapping[str, str], base_dir: Path) -> tuple[str | None, str]:
    for k in ann:
        if k.startswith(ANN_PREFIX) and k not in _ANNOTATIONS:
            hint = difflib.get_close_matches(k, _ANNOTATIONS, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(_ANNOTATIONS)})"
            c.err(join_path("metadata.annotations", k), f"unknown router annotation{extra}")
    f_path, env = ann.get(ANN_CREDENTIAL_FILE), ann.get(ANN_CREDENTIAL_ENV)
    if f_path is not None and env is not None:
        c.err(join_path("metadata.annotations", ANN_CREDENTIAL_ENV),
              f"set only one of {ANN_CREDENTIAL_FILE} and {ANN_CREDENTIAL_ENV}")
        return None, ""
    if f_path is not None:
        p = join_path("metadata.annotations", ANN_CREDENTIAL_FILE)
        full = Path(f_path) if os.path.isabs(f_path) else base_dir / f_path
        try:
            raw = full.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            c.err(p, f"cannot read credential file {str(full)!r}: {getattr(e, 'strerror', None) or type(e).__name__}")
            return None, ANN_CREDENTIAL_FILE
        return _normalize_key(c, raw, p, f"credential file {str(full)!r}"), ANN_CREDENTIAL_FILE
    if env is not None:
        p = join_path("metadata.annotations", ANN_CREDENTIAL_ENV)
        value = os.environ.get(env)
        if value is None:
            c.err(p, f"environment variable {env!r} is not set")
            return None, ANN_CREDENTIAL_ENV
        return _normalize_key(c, value, p, f"environment variable {env!r}"), ANN_CREDENTIAL_ENV
    return None, ""


_SECRET_FIELDS = ("apiVersion", "kind", "metadata", "type", "immutable", "data", "stringData")


def parse_secret(c: Ctx, meta: ObjectMeta, obj: dict[str, Any]) -> SecretDoc | None:
    """A Kubernetes Secret (v1): data values are base64, stringData values plain strings."""
    check_mapping(c, obj, "", _SECRET_FIELDS)
    before = len(c.problems)
    data: dict[str, bytes] = {}
    for section in ("data", "stringData"):
        raw = obj.get(section)
        if raw is None:
            continue
        if not isinstance(raw, dict):
            c.err(section, f"must be a mapping of key to value, got {type_name(raw)}")
            continue
        for k, val in raw.items():
            p = join_path(section, str(k))
            if not isinstance(k, str) or not k:
                c.err(p, "keys must be non-empty strings")
            elif not isinstance(val, str):  # the value itself is never echoed
                c.err(p, f"must be a string, got {type_name(val)}")
            elif section == "stringData":
                data[k] = val.encode("utf-8")
            else:
                try:
                    data[k] = base64.b64decode(val, validate=True)
                except (binascii.Error, ValueError):
                    c.err(p, "not valid base64 (data values are base64-encoded; use stringData for plain text)")
    if len(c.problems) > before:
        return None
    return SecretDoc(meta.namespace, meta.name, meta.labels.get(SECRET_LABEL[0]) == SECRET_LABEL[1], data)


def resolve_credentials(pending: PendingProvider, secrets: Mapping[tuple[str, str], SecretDoc],
                        secret_labels: Mapping[tuple[str, str], str]) -> ExternalProvider | None:
    """The provider with its credential, or None after recording why not on its Ctx.

    `secret_labels` names the document of every Secret seen (valid or not), so that an
    invalid Secret is reported once, not again as "not found"."""
    p, c = pending.provider, pending.ctx
    ref = pending.secret_ref
    if pending.annotation:
        if pending.from_annotation is None:
            return None  # reported by the annotation check
        if ref is not None and (p.namespace, ref[0]) in secret_labels:
            c.err("spec.auth.secretRef.name",
                  f"Secret {ref[0]!r} is also a document of this file: the key comes from {pending.annotation} "
                  "or from the Secret, not both (remove one)")
            return None
        return replace(p, credential=pending.from_annotation, credential_source=pending.annotation)
    if ref is None:
        return p  # no spec.auth: requests go without a credential (Kthena: CredentialNotRequired)
    name, key = ref
    rp = "spec.auth.secretRef"
    if (p.namespace, name) not in secret_labels:
        c.err(join_path(rp, "name"), f"Secret {name!r} not found in namespace {p.namespace!r} "
                                     f"(CredentialsResolved=False: add a Secret document, or the "
                                     f"{ANN_CREDENTIAL_FILE} annotation)", CREDENTIAL_NOT_FOUND)
        return None
    secret = secrets.get((p.namespace, name))
    if secret is None:
        return None  # the Secret document itself is invalid (reported there)
    if not secret.labelled:
        c.err(join_path(rp, "name"), f"Secret {name!r} ({secret_labels[(p.namespace, name)]}) does not have "
                                     f"the label {SECRET_LABEL[0]}: \"{SECRET_LABEL[1]}\" (Kthena's router "
                                     "reads only labelled Secrets)", CREDENTIAL_NOT_FOUND)
        return None
    raw = secret.data.get(key)
    if not raw:
        c.err(join_path(rp, "key"), f"key {key!r} not found (or empty) in Secret {name!r} "
                                    f"({secret_labels[(p.namespace, name)]})", CREDENTIAL_KEY_NOT_FOUND)
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        c.err(join_path(rp, "key"), f"key {key!r} of Secret {name!r} is not UTF-8 text", CREDENTIAL_INVALID)
        return None
    value = _normalize_key(c, text, join_path(rp, "key"), f"key {key!r} of Secret {name!r}", CREDENTIAL_INVALID)
    if value is None:
        return None
    return replace(p, credential=value, credential_source=f"Secret {p.namespace}/{name} key {key}")
