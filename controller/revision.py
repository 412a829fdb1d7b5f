"""Revision hashes of a ModelServing's templates, recorded as Kthena records them.

Kthena labels every pod with `modelserving.volcano.sh/revision` (a hash of all roles) and
`modelserving.volcano.sh/role-template-hash` (a hash of its role), and reports the
revisions in status.currentRevision / updateRevision. Both leave out what does not change
a rendered pod (a role's `replicas`, `maxUnavailable`, `partition`), so scaling is not an
update. The value is FNV-1 32-bit, printed in decimal and mapped through the apimachinery
"safe" alphabet (rand.SafeEncodeString). Kthena hashes Go's dump of its structs; we hash
canonical JSON (sorted keys), so the values differ from Kthena's for the same spec. Only
equality within one controller matters (a group is updated when its label equals the
current hash); a switch from Kthena's controller to ours is seen as one template update.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["fnv1_32", "role_template_hash", "serving_revision"]

_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery/pkg/util/rand alphanums: no vowels, no 0/1/3
_NOT_RENDERED = ("replicas", "maxUnavailable", "partition")


def fnv1_32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = (h * 0x01000193) & 0xFFFFFFFF
        h ^= b
    return h


def _encode(value: int) -> str:
    return "".join(_SAFE[b % len(_SAFE)] for b in str(value).encode())


def _strip(role: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in role.items() if k not in _NOT_RENDERED}


def _hash(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _encode(fnv1_32(text.encode()))


def serving_revision(roles: list[dict[str, Any]]) -> str:
    return _hash([_strip(r) for r in roles])


def role_template_hash(role: dict[str, Any]) -> str:
    return _hash(_strip(role))
