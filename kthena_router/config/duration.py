"""Go duration strings ("30s", "1m30s", "500ms", "1.5h"), as Kubernetes' metav1.Duration."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds of a Go duration string; ValueError with a readable message otherwise."""
    s = text.strip()
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(
                f"invalid duration {text!r} (expected a Go duration like \"30s\", \"1m30s\", \"500ms\")"
            )
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total
