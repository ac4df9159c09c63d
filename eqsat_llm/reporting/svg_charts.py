"""Inline SVG charts for the report page: a line chart (the e-graph's growth) and the dumbbell
chart of predicted against measured time per kernel; no library, nothing fetched."""

from __future__ import annotations

import math
from typing import Any

from ..profile import FLAG_RATIO  # off by more than this factor: flagged, in red
from .html_pieces import esc, fmt_ratio
from .units import fmt_count, fmt_us

# --- charts -------------------------------------------------------------------------------------

def svg_open(w: float, h: float, cls: str, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" width="{w:.0f}" '
            f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" role="img" '
            f'aria-label="{esc(label)}" font-family="Helvetica,Arial,sans-serif" '
            'font-size="12">')


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and multiples of a 1-2-5 step up to at least `top`."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def line_chart(values: list[int], x_label: str, y_label: str) -> str:
    """Values over their index, with both axes labelled and ticked."""
    if not values:
        return "<p>No sizes recorded.</p>"
    w, h, left, right, top, bottom = 720, 300, 80, 20, 20, 50
    ticks = nice_ticks(max(values))
    pw, ph = w - left - right, h - top - bottom

    def x(i: float) -> float:
        return left + pw * i / max(1, len(values) - 1)

    def y(v: float) -> float:
        return top + ph * (1 - v / ticks[-1])

    parts = [svg_open(w, h, "chart", f"{y_label} per {x_label}")]
    for t in ticks:
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                     f'class="grid"/><text x="{left - 6}" y="{y(t) + 4:.1f}" '
                     f'text-anchor="end">{fmt_count(t)}</text>')
    step = max(1, math.ceil(len(values) / 15))
    for i in range(0, len(values), step):
        parts.append(f'<text x="{x(i):.1f}" y="{h - bottom + 18}" text-anchor="middle">{i}'
                     "</text>")
    pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#2f5597" stroke-width="2"/>')
    parts += [f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="4" fill="#2f5597"><title>'
              f"iteration {i}: {v} entries</title></circle>" for i, v in enumerate(values)]
    parts.append(axes(w, h, left, right, top, bottom, x_label, y_label))
    return "".join(parts) + "</svg>"


def axes(w: float, h: float, left: float, right: float, top: float, bottom: float,
         x_label: str, y_label: str) -> str:
    cy = top + (h - top - bottom) / 2
    return (f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" '
            f'class="axis"/><line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" '
            f'class="axis"/><text x="{left + (w - left - right) / 2}" y="{h - 10}" '
            f'text-anchor="middle" class="axis-label">{esc(x_label)}</text>'
            f'<text x="16" y="{cy}" text-anchor="middle" class="axis-label" '
            f'transform="rotate(-90 16 {cy})">{esc(y_label)}</text>')


def dumbbell_chart(kernels: list[dict[str, Any]]) -> str:
    """Predicted against measured time per backend kernel on one log axis."""
    times = [t for pk in kernels for t in (pk.get("predicted_us"), pk.get("measured_us"))
             if t and t > 0]
    lo = 10 ** math.floor(math.log10(min(times) / FLAG_RATIO)) if times else 0.1
    hi = 10 ** math.ceil(math.log10(max(times) * FLAG_RATIO)) if times else 10.0
    w, row, left, right, top, bottom = 1000, 22, 290, 30, 30, 50
    h = top + bottom + row * len(kernels)
    pw = w - left - right

    def x(us: float | None) -> float:
        v = min(max(us or lo, lo), hi)
        return left + pw * math.log10(v / lo) / math.log10(hi / lo)

    parts = [svg_open(w, h, "chart accuracy", "predicted against measured time"),
             log_grid(lo, hi, x, top - 6, h - bottom)]
    for i, pk in enumerate(kernels):
        parts.append(dumbbell_row(pk, top + row * i, row, w, x))
    parts.append(legend(left, top - 12))
    parts.append(axes(w, h, left, right, top, bottom, "time per call (log scale)", ""))
    return "".join(parts) + "</svg>"


def log_grid(lo: float, hi: float, x: Any, y0: float, y1: float) -> str:
    """Vertical lines at 1, 2 and 5 times each decade from lo to hi, decades labelled."""
    parts, decade = [], lo
    while decade <= hi * 1.0001:
        for m in (1, 2, 5):
            if decade * m <= hi * 1.0001:
                cls = "grid" if m == 1 else "grid minor"
                parts.append(f'<line x1="{x(decade * m):.1f}" x2="{x(decade * m):.1f}" '
                             f'y1="{y0}" y2="{y1}" class="{cls}"/>')
        parts.append(f'<text x="{x(decade):.1f}" y="{y1 + 18}" text-anchor="middle">'
                     f"{fmt_us(decade)}</text>")
        decade *= 10
    return "".join(parts)


def legend(x: float, y: float) -> str:
    return (f'<path d="M{x} {y - 4} l5 5 l-5 5 l-5 -5z" class="pred"/><text x="{x + 10}" '
            f'y="{y + 5}">predicted</text><circle cx="{x + 90}" cy="{y + 1}" r="5" '
            f'class="meas"/><text x="{x + 100}" y="{y + 5}">measured</text><rect x="{x + 180}" '
            f'y="{y - 5}" width="30" height="12" class="band"/><text x="{x + 216}" y="{y + 5}">'
            f"within {FLAG_RATIO}x of predicted</text>")


def dumbbell_row(pk: dict[str, Any], y0: float, row: float, w: float, x: Any) -> str:
    p, m = pk.get("predicted_us"), pk.get("measured_us")
    cy = y0 + row / 2
    off = bool(pk.get("flagged"))
    cls = "row off" if off else "row"
    name = str(pk.get("name", ""))
    title = (f"{name}: {ops_text(pk.get('ops'))}; predicted {fmt_us(p)}, "
             f"measured {fmt_us(m)}, ratio {fmt_ratio(pk.get('ratio'))}"
             + (f"; {pk['reason']}" if pk.get("reason") else ""))
    measured = ("" if m is None else
                f'<line x1="{x(p):.1f}" x2="{x(m):.1f}" y1="{cy}" y2="{cy}" class="link"/>'
                f'<circle cx="{x(m):.1f}" cy="{cy}" r="5" class="meas"/>')
    band = (f'<rect x="{x(p / FLAG_RATIO):.1f}" y="{y0 + 4}" width="'
            f'{x(p * FLAG_RATIO) - x(p / FLAG_RATIO):.1f}" height="{row - 8}" class="band"/>'
            if p else "")
    return (f'<g class="{cls}" data-kernel="{esc(name)}"><title>{esc(title)}</title>'
            f'<rect x="0" y="{y0}" width="{w}" height="{row}" class="rowbg"/>{band}'
            f'<text x="8" y="{cy + 4:.1f}">{esc(name[:40])}</text>{measured}'
            f'<path d="M{x(p):.1f} {cy - 6} l6 6 l-6 6 l-6 -6z" class="pred"/></g>')


def ops_text(ops: Any) -> str:
    """A backend kernel's IR ops: the profile writes them joined ("gemm+view")."""
    return ops if isinstance(ops, str) else "+".join(map(str, ops or []))
