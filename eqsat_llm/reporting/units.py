"""Human units for reports: bytes as B/KiB/MiB/GiB, times as us/ms/s, counts as k/M/G.

Three significant digits are enough to compare kernels and read a summary; the JSON keeps the
exact numbers.
"""

from __future__ import annotations


def _scaled(value: float, steps: tuple[tuple[float, str], ...]) -> str:
    """`value` in the largest unit of `steps` (ascending factors) it reaches, 3 digits."""
    factor, unit = steps[0]
    for f, u in steps:
        if abs(value) >= f:
            factor, unit = f, u
    scaled = value / factor
    return f"{scaled:.0f} {unit}" if abs(scaled) >= 100 else f"{scaled:.3g} {unit}"


_BYTES = ((1, "B"), (2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB"), (2**40, "TiB"))
_MICROS = ((1, "us"), (1e3, "ms"), (1e6, "s"))
_COUNT = ((1, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"))


def fmt_bytes(n: float | None) -> str:
    """1536 -> "1.5 KiB"; whole bytes below 1 KiB ("12 B")."""
    if n is None:
        return "-"
    return f"{int(n)} B" if abs(n) < 1024 else _scaled(n, _BYTES)


def fmt_us(us: float | None) -> str:
    """A time given in microseconds: 0.42 -> "0.42 us", 1500 -> "1.5 ms", 2.5e6 -> "2.5 s"."""
    return "-" if us is None else _scaled(us, _MICROS)


def fmt_signed_us(us: float) -> str:
    """A change of time given in microseconds, signed: 3.38 -> "+3.38 us", -1500 -> "-1.5 ms"."""
    return ("+" if us >= 0 else "-") + fmt_us(abs(us))


def fmt_seconds(s: float | None) -> str:
    """A time given in seconds, in the same units as fmt_us."""
    return "-" if s is None else fmt_us(s * 1e6)


def fmt_count(n: float | None, unit: str = "") -> str:
    """A count with an SI prefix: 1573888 FLOP -> "1.57 MFLOP" (unit="FLOP"), 512 -> "512"."""
    if n is None:
        return "-"
    if abs(n) < 1000:
        return f"{n:.3g} {unit}".strip()
    return _scaled(n, _COUNT) + unit
