"""The role ratio constraint of a disaggregated target: replicas[numerator] /
replicas[denominator] within [minRatio, maxRatio], every role within its bounds. Pure.

First Kthena's repair (EnforceRoleRatio, scale-up biased): clamp each role to its bounds;
both roles at zero stay there (coupled scale to zero; the ratio is undefined); a single
zero side is seeded to 1 (a P/D pair with one live role serves nothing); below minRatio
raise the numerator to ceil(minRatio x den), or if that passes its max, saturate it and
lower the denominator to floor(num / minRatio); above maxRatio the mirror image.

Ours beyond Kthena: that repair can still miss when the interval is narrow (min = max = 1.5
with den = 3 gives num = ceil(4.5) = 5, 5/3 > 1.5) or when a clamp undoes a step. Then we
search the feasible pairs and take the one that loses the least of the metric-wanted
capacity (sum of max(0, wanted - got)), then adds the least, then has the fewest replicas.
When no pair within the bounds meets the ratio, Kthena's repair is returned and `met` is
False (the controller reports RatioConstraintViolated).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .policy import RatioConstraint

__all__ = ["RatioResult", "enforce_ratio", "format_ratio", "ratio_met"]

_EPS = 1e-9  # float slack on the ratio comparison (ratios come from decimal quantities)


@dataclass(frozen=True)
class RatioResult:
    replicas: dict[str, int]
    adjusted: bool  # the ratio changed the metric-derived counts
    met: bool  # the final counts satisfy the constraint (or both sides are zero)
    current_ratio: str  # Kthena's status string ("" when the denominator is 0)


def ratio_met(num: int, den: int, c: RatioConstraint) -> bool:
    if num == 0 and den == 0:
        return True
    if den == 0:
        return False
    r = num / den
    return c.min_ratio - _EPS <= r <= c.max_ratio + _EPS


def format_ratio(num: int, den: int) -> str:
    """Go's strconv.FormatFloat(x, 'f', -1, 64): shortest, never an exponent."""
    if den == 0:
        return ""
    r = num / den
    if r == int(r):
        return str(int(r))
    text = repr(r)
    return text if "e" not in text else f"{r:.17f}".rstrip("0")


def _clamp(v: int, b: tuple[int, int]) -> int:
    return min(max(v, b[0]), b[1])


def _kthena_repair(num: int, den: int, nb: tuple[int, int], db: tuple[int, int],
                   c: RatioConstraint) -> tuple[int, int, bool]:
    adjusted = False
    if num == 0:
        num, adjusted = _clamp(1, nb), True
    if den == 0:
        den, adjusted = _clamp(1, db), True
    ratio = num / den
    if ratio < c.min_ratio:
        raised = math.ceil(c.min_ratio * den)
        if raised <= nb[1]:
            num = max(raised, nb[0])
        elif c.min_ratio > 0:
            num = nb[1]
            den = _clamp(math.floor(num / c.min_ratio), db)
        adjusted = True
    elif ratio > c.max_ratio:
        if c.max_ratio <= 0:
            num = 0
        else:
            raised = math.ceil(num / c.max_ratio)
            if raised <= db[1]:
                den = max(raised, db[0])
            else:
                den = db[1]
                num = _clamp(math.floor(c.max_ratio * den), nb)
        adjusted = True
    return _clamp(num, nb), _clamp(den, db), adjusted


def _search(want_n: int, want_d: int, nb: tuple[int, int], db: tuple[int, int],
            c: RatioConstraint) -> tuple[int, int] | None:
    """The feasible pair closest to what the metrics want (O(denominator range))."""
    best: tuple[tuple[int, int, int], tuple[int, int]] | None = None
    for d in range(max(db[0], 1), db[1] + 1):
        lo = max(nb[0], math.ceil(c.min_ratio * d - _EPS))
        hi = min(nb[1], math.floor(c.max_ratio * d + _EPS))
        if lo > hi:
            continue
        n = min(max(want_n, lo), hi)
        lost = max(0, want_n - n) + max(0, want_d - d)
        added = max(0, n - want_n) + max(0, d - want_d)
        score = (lost, added, n + d)
        if best is None or score < best[0]:
            best = (score, (n, d))
    return None if best is None else best[1]


def enforce_ratio(replicas: Mapping[str, int], bounds: Mapping[str, tuple[int, int]],
                  constraint: RatioConstraint | None) -> RatioResult:
    """Project per-role counts into the feasible region (see the module docstring)."""
    final = {role: _clamp(v, bounds[role]) if role in bounds else v for role, v in replicas.items()}
    if constraint is None:
        return RatioResult(final, False, True, "")
    nr, dr = constraint.numerator_role, constraint.denominator_role
    for role in (nr, dr):
        if role not in final or role not in bounds:
            raise KeyError(f"ratio role {role} has no replicas or bounds")
    nb, db = bounds[nr], bounds[dr]
    num, den = final[nr], final[dr]
    if num == 0 and den == 0:
        return RatioResult(final, False, True, "")
    want_n, want_d = num, den
    num, den, adjusted = _kthena_repair(num, den, nb, db, constraint)
    if not ratio_met(num, den, constraint):
        found = _search(want_n, want_d, nb, db, constraint)
        if found is not None:
            num, den = found
            adjusted = True
    final[nr], final[dr] = num, den
    return RatioResult(final, adjusted or (num, den) != (want_n, want_d), ratio_met(num, den, constraint),
                       format_ratio(num, den))
