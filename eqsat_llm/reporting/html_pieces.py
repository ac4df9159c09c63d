"""The report page's small pieces: escaping, tables, bars, section frames, op colours, and the
report's kernels joined with the profile (predicted against measured)."""

from __future__ import annotations

import html
from typing import Any

from ..ops import REGISTRY
from ..profile import FLAG_RATIO  # off by more than this factor: flagged, in red
from .units import fmt_signed_us

COLORS = {"matmul": "#f4b183", "attention": "#ff8c8c", "reduction": "#a9d18e",
          "elementwise": "#9dc3e6", "layout": "#d9d9d9", "source": "#ffffff",
          "fallback": "#ffd966"}
# outline colours of the fused groups, cycled
GROUP_COLORS = ("#7030a0", "#c55a11", "#2e75b6", "#548235", "#bf0041", "#7f6000")


def category(op: str) -> str:
    """The colour group of an op: its registry category, or fallback."""
    return REGISTRY[op].category if op in REGISTRY else "fallback"


def esc(value: Any) -> str:
    return html.escape(str(value))


# --- joining the report's kernels with the profile --------------------------------------------

def profile_by_node(d: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The profile's backend kernel each IR node of the optimized program ran in."""
    out: dict[int, dict[str, Any]] = {}
    for pk in (d.get("profile") or {}).get("kernels") or []:
        for node_id in pk.get("node_ids") or []:
            out.setdefault(node_id, pk)
    return out


def fused_groups(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The backend kernels covering more than one IR node: outlined in the "after" drawing.
    Without a profile there are none (the report has no other record of the backend's
    grouping)."""
    kernels = (d.get("profile") or {}).get("kernels") or []
    return [pk for pk in kernels if len(pk.get("node_ids") or []) > 1]


def ratio_of(predicted: float | None, measured: float | None) -> float | None:
    """measured / predicted; None when either is missing or the prediction is zero."""
    if not predicted or measured is None:
        return None
    return measured / predicted


def is_off(ratio: float | None) -> bool:
    return ratio is not None and not 1 / FLAG_RATIO <= ratio <= FLAG_RATIO


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def fmt_delta(us: float | None) -> str:
    return "cycle" if us is None else fmt_signed_us(us)


def margin(alternatives: list[dict[str, Any]]) -> float | None:
    """By how much the chosen kernel beat the next best alternative (the smallest change of the
    program's predicted cost); None when every alternative would make a cycle."""
    deltas = [a["delta_us"] for a in alternatives if a.get("delta_us") is not None]
    return min(deltas) if deltas else None


def measured_of(kernel: dict[str, Any], pk: dict[str, Any] | None) -> tuple[Any, Any, bool]:
    """(measured us, ratio, off) of a kernel row: its backend kernel's when profiled."""
    if pk is not None:
        ratio = pk.get("ratio", ratio_of(pk.get("predicted_us"), pk.get("measured_us")))
        return pk.get("measured_us"), ratio, bool(pk.get("flagged", is_off(ratio)))
    ratio = ratio_of(kernel.get("predicted_us"), kernel.get("measured_us"))
    return kernel.get("measured_us"), ratio, is_off(ratio)


# --- small HTML pieces --------------------------------------------------------------------------

def table(head: list[str], rows: list[list[str]], row_attrs: list[str] | None = None,
          cls: str = "") -> str:
    """A table of already-escaped cells; no header row when `head` is empty."""
    attrs = row_attrs or [""] * len(rows)
    cells = "".join(f"<th>{esc(c)}</th>" for c in head)
    thead = f"<thead><tr>{cells}</tr></thead>" if head else ""
    body = "".join(f"<tr{a}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>"
                   for r, a in zip(rows, attrs))
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def fmt_type(t: str) -> str:
    """A type string for a table: Python scalars (a gemm's alpha, beta) in grey."""
    if t.startswith("py_"):
        return '<span class="dim">scalar</span>'
    return f"<code>{esc(t)}</code>"


def bar(fraction: float, cls: str = "") -> str:
    width = max(0.0, min(1.0, fraction)) * 100
    return f'<span class="bar {cls}"><span style="width:{width:.1f}%"></span></span>'


def section(sid: str, heading: str, inner: str) -> str:
    return f'<section id="{sid}"><h2>{esc(heading)}</h2>{inner}</section>'
