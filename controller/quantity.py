"""Kubernetes resource quantities (apimachinery's resource.Quantity): parse, add, multiply
and print in the canonical form Go's `Quantity.String()` writes, so the sums in a PodGroup's
`minResources` read exactly as Kthena's controller writes them ("2" + "500m" -> "2500m",
"1Gi" + "512Mi" -> "1536Mi").

The value is exact (a Fraction); the format is the one Go keeps: BinarySI for Ki..Ei
suffixes, DecimalExponent for e-notation, DecimalSI otherwise; a sum takes the format of its
first non-zero term (Quantity.Add), a product keeps it (Quantity.Mul). Parsing rounds up to
nano precision (ParseQuantity).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Quantity", "canonical", "parse"]

BINARY_SI = "BinarySI"
DECIMAL_SI = "DecimalSI"
DECIMAL_EXPONENT = "DecimalExponent"

_PATTERN = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_BINARY_SUFFIX = {v: k for k, v in _BINARY.items()}
_NANO = 10 ** 9


@dataclass(frozen=True)
class Quantity:
    value: Fraction
    format: str = DECIMAL_SI

    def __add__(self, other: Quantity) -> Quantity:
        fmt = other.format if self.value == 0 else self.format
        return Quantity(self.value + other.value, fmt)

    def __mul__(self, n: int) -> Quantity:
        return Quantity(self.value * n, self.format)

    def __str__(self) -> str:
        return canonical(self)


def parse(text: str | int | float) -> Quantity:
    """A quantity from its string (or the integer an int-or-string field may hold)."""
    if isinstance(text, bool):
        raise ValueError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Quantity(Fraction(text), DECIMAL_SI)
    s = str(text).strip()
    m = _PATTERN.match(s)
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    value = Fraction(number if not number.endswith(".") else number[:-1])
    if suffix in _BINARY:
        value *= 1024 ** _BINARY[suffix]
        fmt = BINARY_SI
    elif suffix[:1] in ("e", "E"):
        value *= Fraction(10) ** int(suffix[1:])
        fmt = DECIMAL_EXPONENT
    else:
        value *= Fraction(10) ** _DECIMAL[suffix]
        fmt = DECIMAL_SI
    if sign == "-":
        value = -value
    scaled = value * _NANO
    if scaled.denominator != 1:  # more precise than nano: round up (away from zero), as Go does
        whole = -((-abs(scaled.numerator)) // scaled.denominator)
        value = Fraction(whole if value > 0 else -whole, _NANO)
    return Quantity(value, fmt)


def _decimal(value: Fraction) -> tuple[int, int]:
    """value = mantissa * 10**exponent, exponent a multiple of 3, as large as possible."""
    exponent = 0
    while value.denominator != 1:
        value *= 10
        exponent -= 1
    mantissa = value.numerator
    while mantissa != 0 and mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3  # floor to a multiple of 3
    return mantissa * 10 ** shift, exponent - shift


def canonical(q: Quantity) -> str:
    """Go's Quantity.String() (CanonicalizeBytes)."""
    v = q.value
    if v == 0:
        return "0"
    fmt = q.format
    if fmt == BINARY_SI and (-1024 < v < 1024 or v.denominator != 1):
        fmt = DECIMAL_SI  # no rounding: small or fractional values print in decimal
    if fmt == BINARY_SI:
        amount, exponent = v.numerator, 0
        while amount % 1024 == 0 and exponent < 6:
            amount //= 1024
            exponent += 1
        return f"{amount}{_BINARY_SUFFIX.get(exponent, '')}"
    mantissa, exponent = _decimal(v)
    if fmt == DECIMAL_SI and exponent in _DECIMAL_SUFFIX:
        return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"
    return f"{mantissa}" if exponent == 0 else f"{mantissa}e{exponent}"
