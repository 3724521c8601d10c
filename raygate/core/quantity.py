"""Kubernetes resource quantities: parse to exact Decimals and format the way the API server does."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}
_PATTERN = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")

Resources = dict[str, Decimal]


class QuantityError(ValueError):
    pass


# Kubernetes stores a quantity in an int64 of its smallest unit: anything larger is not a quantity the
# API server could hold, and an unbounded exponent ("1e99999999999") would only cost time or overflow.
MAX_TEXT = 64
MAX_VALUE = Decimal(2**63 - 1)
_MAX_EXPONENT = 30


def parse(value: object) -> Decimal:
    """Parse "500m", "1.5Gi", 2, "1e3"; raise QuantityError with the offending text."""
    if type(value) is str:
        return _parse_text(value)  # the common case, memoised: Decimals are immutable
    return _parse(value)


def _parse(value: object) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return _bounded(Decimal(str(value)), value)
    if not isinstance(value, str):
        raise QuantityError(f"{_short(value)} is not a quantity")
    if len(value) > MAX_TEXT:
        raise QuantityError(f"{_short(value)} is not a quantity: longer than {MAX_TEXT} characters")
    m = _PATTERN.match(value.strip())
    if not m:
        raise QuantityError(f"{value!r} is not a quantity (examples: 500m, 2, 16Gi)")
    number, exponent, suffix = m.groups()
    try:
        base = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the regex admits only valid numbers
        raise QuantityError(f"{value!r} is not a quantity") from err
    if exponent:
        power = int(exponent[1:])
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{value!r} is out of range: Kubernetes quantities stay below 2^63")
        return _bounded(base * (Decimal(10) ** power), value)
    if suffix in _BINARY:
        return _bounded(base * _BINARY[suffix], value)
    return _bounded(base * _DECIMAL[suffix or ""], value)


def _bounded(d: Decimal, value: object) -> Decimal:
    if not d.is_finite() or abs(d) > MAX_VALUE:
        raise QuantityError(f"{_short(value)} is out of range: Kubernetes quantities stay below 2^63")
    if d < 0:
        raise QuantityError(f"{_short(value)} is negative: a request or limit cannot be")
    return d


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# A review parses the same few dozen strings ("8", "64Gi", ...) again and again; errors are not cached.
_parse_text = functools.lru_cache(maxsize=4096)(_parse)


def is_binary(name: str) -> bool:
    """Memory-like resources read best in binary units (Mi, Gi)."""
    return name in {"memory", "ephemeral-storage"} or name.startswith("hugepages-")


def format_quantity(value: Decimal, *, binary: bool = False) -> str:
    """The API server's canonical form: the largest suffix that keeps the mantissa whole."""
    if value == 0:
        return "0"
    if binary and value == value.to_integral_value():
        for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if value % factor == 0:
                return f"{int(value // factor)}{suffix}"
        return str(int(value))
    for suffix in ("E", "P", "T", "G", "M", "k", "", "m", "u", "n"):
        scaled = value / _DECIMAL[suffix]
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    # Below a nanounit: the API server rounds up.
    return f"{int((value / _DECIMAL['n']).to_integral_value(rounding='ROUND_CEILING'))}n"


def add(total: Resources, extra: Mapping[str, Decimal], times: int = 1) -> Resources:
    out = dict(total)
    for name, q in extra.items():
        out[name] = out.get(name, Decimal(0)) + q * times
    return out


def maximum(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Resources:
    out = dict(a)
    for name, q in b.items():
        out[name] = max(out.get(name, Decimal(0)), q)
    return out


def total(items: Iterable[Mapping[str, Decimal]]) -> Resources:
    out: Resources = {}
    for item in items:
        out = add(out, item)
    return out


def render(resources: Mapping[str, Decimal]) -> dict[str, str]:
    return {k: format_quantity(v, binary=is_binary(k)) for k, v in sorted(resources.items()) if v != 0}
