"""The extraction cost report as one self-contained HTML page: what the optimizer chose, why,
and how far its cost model was from the clock.

Everything comes from `report.to_dict()` (docs/report.md); the two programs are drawn from
their IR graphs. Sections, each with a stable id: summary, kernels (every kernel of the
optimized program with its alternatives), decisions (the kernels whose e-class held
alternatives, with their predicted costs), accuracy (predicted against measured time per
backend kernel, when profiled), rules, ops, egraph (growth over the iterations), phases and
programs (before and after, zoomable SVG: graphviz's `dot` where it is installed, otherwise
an embedded layered drawing; hover a node for its shape, dtype and cost; the backend kernels
that cover several nodes are outlined). No external fetch: CSS and scripts are inline, and a
first script records any script error on `<html data-script-errors>` for tests to read.
"""

from __future__ import annotations

import html
import math
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from ..extraction.cost import constant_nodes
from ..extraction.costmodel import CostError, nbytes
from ..ir import VALUE_LEAVES, Graph, Node, TensorType, node_label
from ..ops import REGISTRY
from ..profile import FLAG_RATIO  # off by more than this factor: flagged, in red
from .units import fmt_bytes, fmt_count, fmt_seconds, fmt_signed_us, fmt_us

SECTIONS = (("summary", "Summary"), ("kernels", "Kernels"), ("decisions", "Decisions"),
            ("accuracy", "Predicted against measured"), ("rules", "Rules"),
            ("ops", "Op counts"), ("egraph", "E-graph growth"), ("phases", "Time per phase"),
            ("programs", "Programs before and after"))

COLORS = {"matmul": "#f4b183", "attention": "#ff8c8c", "reduction": "#a9d18e",
          "elementwise": "#9dc3e6", "layout": "#d9d9d9", "source": "#ffffff",
          "fallback": "#ffd966"}
# outline colours of the fused groups, cycled
GROUP_COLORS = ("#7030a0", "#c55a11", "#2e75b6", "#548235", "#bf0041", "#7f6000")


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


# --- summary ------------------------------------------------------------------------------------

def summary_section(d: dict[str, Any]) -> str:
    rows = [["ops", f"{d['nodes_before']} &rarr; {d['nodes_after']}"],
            ["predicted time", (f"{fmt_us(d['cost_before'])} &rarr; "
                                f"<b>{fmt_us(d['cost_after'])}</b> "
                                f"({esc(d['extraction_method'])} extraction)")],
            ["lower bound", lower_bound_text(d)],
            ["e-graph", (f"{d['eclasses']} classes, {d['enodes']} nodes after "
                         f"{d['iterations']} iterations; stopped: {esc(d['stop_reason'])}")],
            ["backend", esc(d.get("backend", ""))]]
    if d.get("profile"):
        rows.append(["cost model error", model_error_text(d["profile"])])
    rows += memory_rows(d.get("memory") or {})
    if d.get("folded_constants"):
        rows.append(["constants folded", (f"{d['folded_constants']} values, "
                                          f"{fmt_bytes(d['folded_bytes'])} prepared")])
    for key, name in (("fallback_ops", "ran in torch (fallback)"), ("torch_ops", "torch steps"),
                      ("unpriced_enodes", "e-nodes not priced"),
                      ("weight_formats", "GEMM weight formats")):
        if d.get(key):
            rows.append([name, esc(counts_text(d[key]))])
    return table([], [[esc(k), v] for k, v in rows], cls="summary")


def counts_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in sorted(value.items()))
    return ", ".join(map(str, value))


def lower_bound_text(d: dict[str, Any]) -> str:
    if d.get("lower_bound") is None:
        return "none (greedy extraction proves no bound)"
    gap = d.get("gap") or 0.0
    verdict = "optimal under the model" if gap <= 1e-9 else f"gap {fmt_us(gap)}"
    return f"{fmt_us(d['lower_bound'])} ({verdict})"


def model_error_text(p: dict[str, Any]) -> str:
    """The cost model's error in one sentence: median ratio, the worst kernel (by how many
    times it is off, either way), how many are off by more than FLAG_RATIO, the totals."""
    kernels = p.get("kernels") or []
    flagged = p.get("flagged")
    count = (len(flagged) if isinstance(flagged, list) else flagged if flagged is not None
             else sum(bool(k.get("flagged")) for k in kernels))
    worst = next((k for k in kernels if k.get("name") == p.get("worst_kernel")), {})
    why = f"; {esc(p['reason'])}" if p.get("reason") else ""
    return (f"measured / predicted: median <b>{fmt_ratio(p.get('median_ratio'))}</b>, worst "
            f"off by <b>{fmt_ratio(p.get('worst_ratio'))}</b> "
            f"({esc(p.get('worst_kernel') or '-')}: ratio {fmt_ratio(worst.get('ratio'))}); "
            f"{count} of {len(kernels)} backend kernels off by more than {FLAG_RATIO}x; total "
            f"{fmt_us(p.get('total_predicted_us'))} predicted, "
            f"{fmt_us(p.get('total_measured_us'))} measured ({esc(p.get('statistic', ''))} of "
            f"{esc(p.get('repeats', ''))} calls on the {esc(p.get('backend', ''))} backend)"
            + why)


def memory_rows(m: dict[str, Any]) -> list[list[str]]:
    if not m:
        return []
    eager = m.get("eager_peak_bytes")
    text = (f"arena {fmt_bytes(m.get('arena_bytes'))} (liveness bound "
            f"{fmt_bytes(m.get('lower_bound_bytes'))}, every intermediate in its own buffer "
            f"{fmt_bytes(m.get('naive_bytes'))}"
            + (f", eager peak {fmt_bytes(eager)}" if eager is not None else "")
            + f"); {m.get('inplace', 0)} in place, {m.get('views', 0)} views")
    return [["memory", text]]


# --- kernels and decisions ------------------------------------------------------------------------

def kernels_section(d: dict[str, Any]) -> str:
    kernels = d.get("kernels") or []
    if not kernels:
        return "<p>The report lists no kernels.</p>"
    by_node = profile_by_node(d)
    row_ids = {k["id"] for k in kernels}
    rows, attrs = [], []
    for k in kernels:
        measured, ratio, off = measured_of(k, by_node.get(k["id"]))
        attrs.append(f' id="kernel-{k["id"]}" data-kernel="{k["id"]}"'
                     + (' class="off"' if off else ""))
        rows.append([str(k["id"]), kernel_name(k),
                     inputs_cell(k, row_ids),
                     fmt_type(str(k.get("output", ""))), cost_cell(k),
                     measured_cell(measured, by_node.get(k["id"])), fmt_ratio(ratio),
                     esc(", ".join(k.get("rules") or [])) or '<span class="dim">-</span>',
                     alternatives_cell(k)])
    note = (f"<p>Rows in red: the kernel's backend kernel took more than {FLAG_RATIO}x or less "
            f"than 1/{FLAG_RATIO} of its predicted time. Measured time and ratio are the backend "
            "kernel's, shared by the IR nodes it covers.</p>")
    head = ["#", "kernel", "inputs", "output", "predicted", "measured", "measured / predicted",
            "rules that built it", "alternatives"]
    return note + table(head, rows, attrs, cls="kernels")


def inputs_cell(k: dict[str, Any], row_ids: set[int]) -> str:
    """Input types, each after the node that computes it (a link when that is a kernel)."""
    types = k.get("inputs") or []
    operands = k.get("operands") or [None] * len(types)
    cells = []
    for t, i in zip(types, operands):
        ref = ("" if i is None or t.startswith("py_") else
               f'<a href="#kernel-{i}">%{i}</a> ' if i in row_ids else
               f'<span class="dim">%{i}</span> ')
        cells.append(f'<span class="nw">{ref}{fmt_type(t)}</span>')
    return "<br>".join(cells)


def kernel_name(k: dict[str, Any]) -> str:
    bound = k.get("bound")
    badge = f' <span class="badge {esc(bound)}">{esc(bound)}</span>' if bound else ""
    return f"<b>{esc(k.get('label') or k.get('op'))}</b>{badge}"


def cost_cell(k: dict[str, Any]) -> str:
    work = []
    if k.get("flops"):
        work.append(fmt_count(k["flops"], "FLOP"))
    if k.get("bytes"):
        work.append(fmt_bytes(k["bytes"]))
    detail = f'<br><span class="dim">{esc(", ".join(work))}</span>' if work else ""
    return fmt_us(k.get("predicted_us")) + detail


def measured_cell(measured: float | None, pk: dict[str, Any] | None) -> str:
    if measured is None:
        return '<span class="dim">-</span>'
    group = f'<br><span class="dim">in {esc(pk.get("name"))}</span>' if pk else ""
    return fmt_us(measured) + group


def alternatives_cell(k: dict[str, Any]) -> str:
    alts = k.get("alternatives") or []
    if not alts:
        return '<span class="dim">none</span>'
    best = margin(alts)
    chosen = ("every alternative makes a cycle" if best is None else
              f"next best {fmt_delta(best)}" if best >= 0 else
              f"an alternative was {fmt_us(-best)} cheaper")
    return (f"<details><summary>{alternatives_count(k)}: {esc(chosen)}</summary>"
            f"{alternatives_table(k)}</details>")


def alternatives_count(k: dict[str, Any]) -> str:
    """"3", or "6 of 40" when the report kept only the closest alternatives."""
    shown, total = len(k.get("alternatives") or []), k.get("alternatives_total") or 0
    return f"{shown} of {total}" if total > shown else str(shown)


def alternatives_table(k: dict[str, Any]) -> str:
    """The chosen kernel and what it beat, cheapest change first, with bars to compare."""
    alts = sorted(k.get("alternatives") or [],
                  key=lambda a: (a.get("delta_us") is None, a.get("delta_us") or 0.0))
    top = max([abs(a.get("delta_us") or 0.0) for a in alts] + [1e-9])
    notes = any(a.get("note") for a in alts)  # a column only when some alternative has one
    rows = [["<b>chosen</b>", f"<code>{esc(k.get('label') or k.get('op'))}</code>",
             fmt_us(k.get("predicted_us")), "0"] + [""] * notes]
    for a in alts:
        delta = a.get("delta_us")
        rows.append([esc(a.get("op", "")), f"<code>{esc(a.get('term', ''))}</code>",
                     fmt_us(a.get("own_us")),
                     fmt_delta(delta) + " " + bar(abs(delta or 0.0) / top,
                                                  "neg" if (delta or 0) < 0 else "")]
                    + [esc(a.get("note") or "")] * notes)
    attrs = [' class="chosen"'] + [""] * len(alts)
    head = ["op", "term", "own predicted cost", "program cost if chosen"] + ["note"] * notes
    return table(head, rows, attrs, cls="alts")


def decisions_section(d: dict[str, Any]) -> str:
    kernels = d.get("kernels") or []
    chosen = [k for k in kernels if k.get("alternatives")]
    if not chosen:
        return ("<p>No kernel's e-class held an alternative the report records (every kernel "
                "was the only way to compute its value, or alternatives were not recorded).</p>")
    intro = (f"<p>{len(chosen)} of {len(kernels)} kernels were chosen among alternatives. Each "
             "alternative's own predicted cost, and the change of the whole program's predicted "
             "cost had it been chosen instead (what extraction compares: an alternative may "
             "cost less alone and more in the program, when it needs inputs nothing else "
             "computes; <i>cycle</i>: choosing it would make the program depend on "
             "itself).</p>")
    # the kernels that compute come first; views, slices and permutes below, folded
    layout = [k for k in chosen if category(k.get("op", "")) == "layout"]
    compute = [k for k in chosen if k not in layout]
    folded = (f"<details><summary>{len(layout)} layout kernels (views, slices, permutes) "
              "chosen among alternatives</summary>" + "".join(decision(k) for k in layout)
              + "</details>") if layout else ""
    return intro + "".join(decision(k) for k in compute) + folded


def decision(k: dict[str, Any]) -> str:
    ins = ", ".join(t for t in k.get("inputs") or [] if not t.startswith("py_"))
    rules = ", ".join(k.get("rules") or []) or "none recorded"
    others = (f"; other rules that fired in its e-class: {esc(', '.join(k['class_rules']))}"
              if k.get("class_rules") else "")
    return (f'<div class="decision" id="decision-{k["id"]}"><h3>{esc(k.get("label"))} '
            f'<a href="#kernel-{k["id"]}">#{k["id"]}</a></h3>'
            f"<p><code>{esc(ins)}</code> &rarr; <code>{esc(k.get('output'))}</code>; predicted "
            f"{fmt_us(k.get('predicted_us'))}; built by: <b>{esc(rules)}</b>{others}</p>"
            f"{sharing_text(k.get('sharing'))}<p>Alternatives in its e-class "
            f"({alternatives_count(k)}):</p>{alternatives_table(k)}</div>")


def sharing_text(sharing: Any) -> str:
    """A kernel several others read: what computing it once per reader would cost."""
    if not sharing:
        return ""
    if not isinstance(sharing, dict):
        return f"<p>{esc(sharing)}</p>"
    readers = ", ".join(f'<a href="#kernel-{c}">#{c}</a>' for c in sharing.get("consumers") or [])
    terms = "".join(f"<li><code>{esc(t)}</code></li>" for t in sharing.get("unshared") or [])
    return (f"<p>Shared by {readers}: computing it separately for each reader would change "
            f"the program's predicted cost by <b>{fmt_delta(sharing.get('unshared_delta_us'))}"
            f"</b>{', as:' if terms else '.'}</p>" + (f"<ul>{terms}</ul>" if terms else ""))


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


def accuracy_section(d: dict[str, Any]) -> str:
    p = d.get("profile")
    if not p or not p.get("kernels"):
        return ("<p>Not profiled: run <code>eqsat-llm optimize ... --profile</code> to measure "
                "each backend kernel and compare it with the cost model's prediction.</p>")
    flagged = [pk for pk in p["kernels"] if pk.get("flagged")]
    caption = (f'<p class="caption">{model_error_text(p)}. Each row is one backend kernel: '
               "the hollow diamond is its predicted time, the dot its measured time, the green "
               f"band the range within {FLAG_RATIO}x of the prediction; red rows lie outside it."
               "</p>")
    reasons = "".join(f"<li><b>{esc(pk.get('name'))}</b> ({fmt_ratio(pk.get('ratio'))}): "
                      f"{esc(pk.get('reason') or 'no reason given')}</li>" for pk in flagged)
    return (caption + dumbbell_chart(p["kernels"])
            + (f"<h3>Off by more than {FLAG_RATIO}x</h3><ul>{reasons}</ul>" if flagged else ""))


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


# --- rules, ops, phases -------------------------------------------------------------------------

def rules_section(d: dict[str, Any]) -> str:
    built: dict[str, list[str]] = {}
    for k in d.get("kernels") or []:
        for r in k.get("rules") or []:
            built.setdefault(r, []).append(f'<a href="#kernel-{k["id"]}">#{k["id"]}</a>')
    rules = d.get("rules") or []
    fired = sorted((r for r in rules if r["matches"]), key=lambda r: (not r["used"],
                                                                       -r["matches"]))
    rows = [[esc(r["name"]), esc(r["family"]), esc(r["soundness"]), str(r["matches"]),
             "yes" if r["used"] else "no", " ".join(built.get(r["name"], [])) or "-"]
            for r in fired]
    return (f"<p>{len(fired)} of {len(rules)} rules matched; "
            f"{sum(r['used'] for r in fired)} built part of the extracted program.</p>"
            + table(["rule", "family", "soundness", "matches", "used", "kernels it built"],
                    rows))


def ops_section(d: dict[str, Any]) -> str:
    before, after = d.get("op_counts_before") or {}, d.get("op_counts_after") or {}
    ops = sorted(set(before) | set(after), key=lambda o: (-before.get(o, 0), o))
    return table(["op", "before", "after"],
                 [[esc(o), str(before.get(o, 0)), str(after.get(o, 0))] for o in ops])


def phases_section(d: dict[str, Any]) -> str:
    timings = d.get("timings") or {}
    if not timings:
        return "<p>No timings recorded.</p>"
    total = sum(timings.values()) or 1.0
    rows = [[esc(k), fmt_seconds(v), bar(v / total)] for k, v in timings.items()]
    rows.append(["<b>total</b>", f"<b>{fmt_seconds(sum(timings.values()))}</b>", ""])
    return table(["phase", "time", "share"], rows, cls="phases")


# --- the programs -------------------------------------------------------------------------------

def drawn_nodes(graph: Graph) -> list[Node]:
    live = graph.live_ids()
    return [n for n in graph.nodes if n.id in live and n.op != "scalar"]


def category(op: str) -> str:
    return REGISTRY[op].category if op in REGISTRY else "fallback"


def node_lines(n: Node, cost: str) -> list[str]:
    """The drawn label: op (and a leaf's name), shape and dtype, cost."""
    name = n.attrs.get("name") if n.op in ("input", "param", "const") else None
    t = n.type
    shape = (f"{'x'.join(map(str, t.shape)) or 'scalar'} {t.dtype}"
             if isinstance(t, TensorType) else "tuple")
    return [node_label(n) + (f" {name}" if name else ""), shape, cost]


def node_title(n: Node, cost: str, group: dict[str, Any] | None) -> str:
    """The hover text: id, op, shape, dtype, cost and the backend kernel it runs in."""
    t = n.type
    kind = (f"shape [{', '.join(map(str, t.shape))}], dtype {t.dtype}, {fmt_bytes(size(t))}"
            if isinstance(t, TensorType) else f"tuple {t}")
    lines = [f"#{n.id} {node_label(n)}", kind, f"cost: {cost}"]
    if group is not None:
        lines.append(f"backend kernel {group.get('name')}: measured "
                     f"{fmt_us(group.get('measured_us'))}")
    return "\n".join(lines)


def size(t: TensorType) -> float | None:
    try:
        return nbytes(t)
    except CostError:  # a dtype without an element size: the hover text says "-"
        return None


def before_costs(graph: Graph, cost_model: Any) -> dict[int, str]:
    """Cost text per node of the captured program: the model's prediction, when one is given;
    constant subgraphs are folded at compile time (as the report's cost_before counts them)."""
    const = constant_nodes(graph)
    out = {}
    for n in drawn_nodes(graph):
        if n.op in VALUE_LEAVES:
            out[n.id] = "leaf"
        elif n.id in const:
            out[n.id] = "folded at compile time"
        elif cost_model is not None:
            out[n.id] = priced(graph, n, cost_model)
        else:
            out[n.id] = "not priced"
    return out


def priced(graph: Graph, n: Node, cost_model: Any) -> str:
    ins = [graph.node(i).type for i in n.inputs]
    if not all(isinstance(t, TensorType) for t in ins):
        return "not priced"
    try:
        k = cost_model.kernel(n.op, n.attrs, ins, n.type)
    except CostError:  # an op the model has no entry for: say so rather than fail the page
        return "not priced"
    return f"{fmt_us(k.micros)} ({k.bound})"


def after_costs(graph: Graph, d: dict[str, Any]) -> dict[int, str]:
    by_id = {k["id"]: k for k in d.get("kernels") or []}
    out = {}
    for n in drawn_nodes(graph):
        k = by_id.get(n.id)
        out[n.id] = ("leaf" if n.op in VALUE_LEAVES else "not priced" if k is None
                     else f"{fmt_us(k.get('predicted_us'))} ({k.get('bound')})")
    return out


def graph_svg(graph: Graph, title: str, costs: dict[int, str],
              groups: Sequence[dict[str, Any]] = ()) -> str:
    """SVG of the program: graphviz if `dot` is on PATH, else a layered drawing of our own.
    Either way each node carries a hover `<title>` and fused groups are outlined."""
    dot = shutil.which("dot")
    if dot:
        try:
            out = subprocess.run([dot, "-Tsvg"], input=graph_dot(graph, title, costs, groups),
                                 text=True, capture_output=True, timeout=60, check=True).stdout
            return dot_titles(out[out.index("<svg"):], graph, costs, groups)
        except (subprocess.SubprocessError, ValueError, OSError):
            pass  # fall back to the embedded drawing
    return layered_svg(graph, costs, groups)


def group_of(groups: Sequence[dict[str, Any]]) -> dict[int, tuple[int, dict[str, Any]]]:
    """Node id -> (index, group); a node in two groups keeps its first (outlines are
    disjoint)."""
    out: dict[int, tuple[int, dict[str, Any]]] = {}
    for gi, g in enumerate(groups):
        for node_id in g.get("node_ids") or []:
            out.setdefault(node_id, (gi, g))
    return out


def group_title(g: dict[str, Any]) -> str:
    return (f"backend kernel {g.get('name')}: nodes "
            f"{', '.join(map(str, g.get('node_ids') or []))}; predicted "
            f"{fmt_us(g.get('predicted_us'))}, measured {fmt_us(g.get('measured_us'))}")


def graph_dot(graph: Graph, title: str, costs: dict[int, str],
              groups: Sequence[dict[str, Any]] = ()) -> str:
    nodes = drawn_nodes(graph)
    member = group_of(groups)
    lines = [f'digraph "{title}" {{', ("rankdir=TB; node [shape=box, style=\"filled,rounded\", "
             'fontname="Helvetica", fontsize=11];')]

    def node_line(n: Node) -> str:
        label = "\\n".join(node_lines(n, costs.get(n.id, ""))).replace('"', "'")
        return f'n{n.id} [label="{label}", fillcolor="{COLORS[category(n.op)]}"];'

    for gi, g in enumerate(groups):
        inside = [node_line(n) for n in nodes if member.get(n.id, (None,))[0] == gi]
        color = GROUP_COLORS[gi % len(GROUP_COLORS)]
        lines.append(f'subgraph cluster_{gi} {{ style="dashed,bold"; color="{color}"; '
                     f'fontcolor="{color}"; label="{g.get("name")}"; ' + " ".join(inside) + "}")
    lines += [node_line(n) for n in nodes if n.id not in member]
    drawn = {n.id for n in nodes}
    lines += [f"n{i} -> n{n.id};" for n in nodes for i in n.inputs if i in drawn]
    lines.append("}")
    return "\n".join(lines)


def dot_titles(svg: str, graph: Graph, costs: dict[int, str],
               groups: Sequence[dict[str, Any]]) -> str:
    """Graphviz titles a node by its name (n12) and a cluster by its (cluster_3): replace them
    with the hover text."""
    member = group_of(groups)

    def node(m: re.Match[str]) -> str:
        n = graph.node(int(m.group(1)))
        g = member.get(n.id, (None, None))[1]
        return f"<title>{esc(node_title(n, costs.get(n.id, ''), g))}</title>"

    def cluster(m: re.Match[str]) -> str:
        return f"<title>{esc(group_title(groups[int(m.group(1))]))}</title>"

    svg = re.sub(r"<title>n(\d+)</title>", node, svg)
    return re.sub(r"<title>cluster_(\d+)</title>", cluster, svg)


BOX_W, BOX_H, GAP_X, GAP_Y = 200, 50, 26, 44


def layers(graph: Graph) -> dict[int, list[Node]]:
    """Nodes by depth: as late as their first user allows (the longest path to an output),
    so weights and constant chains are drawn just above the kernel that reads them rather
    than all in the first rows."""
    nodes = drawn_nodes(graph)
    depth: dict[int, int] = {}
    for n in nodes:  # topological order: the longest path from a leaf
        depth[n.id] = 1 + max((depth[i] for i in n.inputs if i in depth), default=-1)
    first_use: dict[int, int] = {}
    for n in reversed(nodes):  # then each node as late as its users allow
        if n.id in first_use:
            depth[n.id] = first_use[n.id] - 1
        for i in n.inputs:
            first_use[i] = min(first_use.get(i, depth[n.id]), depth[n.id])
    out: dict[int, list[Node]] = {}
    for n in nodes:
        out.setdefault(depth[n.id], []).append(n)
    return out


def positions(graph: Graph) -> dict[int, tuple[float, float]]:
    """Top-left corner of each node's box: layer by layer, each layer ordered by the mean
    position of its inputs (fewer crossings) and centred."""
    by_depth = layers(graph)
    widest = max((len(v) for v in by_depth.values()), default=1)
    width = widest * (BOX_W + GAP_X)
    pos: dict[int, tuple[float, float]] = {}
    for r, d in enumerate(sorted(by_depth)):  # rows without gaps
        row = by_depth[d]

        def centre(n: Node, k: int) -> float:
            xs = [pos[i][0] for i in n.inputs if i in pos]
            return sum(xs) / len(xs) if xs else k * (BOX_W + GAP_X)

        order = sorted(enumerate(row), key=lambda kn: centre(kn[1], kn[0]))
        x0 = GAP_X + (width - len(row) * (BOX_W + GAP_X)) / 2
        for k, (_, n) in enumerate(order):
            pos[n.id] = (x0 + k * (BOX_W + GAP_X), GAP_Y + r * (BOX_H + GAP_Y))
    return pos


def layered_svg(graph: Graph, costs: dict[int, str] | None = None,
                groups: Sequence[dict[str, Any]] = ()) -> str:
    costs = costs or {}
    nodes = drawn_nodes(graph)
    pos = positions(graph)
    member = group_of(groups)
    width = max((x for x, _ in pos.values()), default=0) + BOX_W + GAP_X
    height = max((y for _, y in pos.values()), default=0) + BOX_H + GAP_Y
    parts = [svg_open(width, height, "program", "program drawing")]
    for n in nodes:
        for i in n.inputs:
            if i in pos:
                gi = member.get(n.id, (None,))[0]
                fused = gi is not None and member.get(i, (None,))[0] == gi
                parts.append(edge(pos[i], pos[n.id], GROUP_COLORS[gi % len(GROUP_COLORS)]
                                  if fused else None))
    for gi, g in enumerate(groups):
        parts.append(outline([pos[i] for i in g.get("node_ids") or [] if i in pos
                              and member[i][0] == gi], gi, g))
    for n in nodes:
        group = member.get(n.id, (None, None))[1]
        parts.append(node_box(n, pos[n.id], costs.get(n.id, ""), group))
    return "".join(parts) + "</svg>"


def edge(a: tuple[float, float], b: tuple[float, float], color: str | None) -> str:
    """An input edge; inside a fused group, thick and in the group's colour."""
    x0, y0, x1, y1 = a[0] + BOX_W / 2, a[1] + BOX_H, b[0] + BOX_W / 2, b[1]
    mid = (y0 + y1) / 2
    style = f' style="stroke:{color};stroke-width:3"' if color else ""  # over the class's grey
    return (f'<path d="M{x0:.0f} {y0:.0f} C{x0:.0f} {mid:.0f} {x1:.0f} {mid:.0f} {x1:.0f} '
            f'{y1:.0f}" class="edge"{style}/>')


def outline(corners: list[tuple[float, float]], gi: int, g: dict[str, Any]) -> str:
    """A fused group: each member boxed in the group's colour (a hull around members that the
    layout did not place side by side would enclose other nodes), named above the first."""
    if not corners:
        return ""
    pad = 6
    color = GROUP_COLORS[gi % len(GROUP_COLORS)]
    x0, y0 = min(corners, key=lambda c: (c[1], c[0]))
    boxes = "".join(f'<rect x="{x - pad:.0f}" y="{y - pad:.0f}" width="{BOX_W + 2 * pad}" '
                    f'height="{BOX_H + 2 * pad}" rx="9"/>' for x, y in corners)
    return (f'<g class="group" stroke="{color}"><title>{esc(group_title(g))}</title>{boxes}'
            f'<text x="{x0 - pad:.0f}" y="{y0 - pad - 3:.0f}" fill="{color}" stroke="none">'
            f"{esc(g.get('name'))}</text></g>")


def node_box(n: Node, xy: tuple[float, float], cost: str, group: dict[str, Any] | None) -> str:
    x, y = xy
    texts = "".join(
        f'<text x="{x + 8:.0f}" y="{y + 15 + 14 * k:.0f}"{cls}>{esc(line[:30])}</text>'
        for k, (line, cls) in enumerate(zip(node_lines(n, cost),
                                            ("", ' class="dim"', ' class="dim"'))))
    return (f'<g class="node" data-node="{n.id}"><title>{esc(node_title(n, cost, group))}'
            f'</title><rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="{COLORS[category(n.op)]}" stroke="#333"/>{texts}</g>')


def programs_section(before: Graph, after: Graph, d: dict[str, Any], cost_model: Any) -> str:
    groups = fused_groups(d)
    note = ("Dashed outlines: backend kernels that cover several IR nodes (from the profile)."
            if groups else "No fused groups outlined: the report has no profile, the only "
            "record of how the backend grouped the nodes into kernels.")
    help_ = ("Scroll to zoom at the pointer, drag to pan, or use the buttons (+, &minus;, fit "
             "width, whole drawing); hover a node for its shape, dtype and cost.")
    return (f"<p>{help_} {note}</p>"
            + viewer("before", graph_svg(before, "before", before_costs(before, cost_model)))
            + viewer("after", graph_svg(after, "after", after_costs(after, d), groups)))


def viewer(name: str, svg: str) -> str:
    buttons = "".join(f'<button type="button" data-act="{a}" title="{t}">{s}</button>'
                      for a, s, t in (("in", "+", "zoom in"), ("out", "&minus;", "zoom out"),
                                      ("width", "fit width", "the full width, from the top"),
                                      ("all", "whole", "the whole drawing")))
    return (f'<div class="viewer" id="program-{name}"><div class="tools"><b>{name}</b> '
            f"{buttons}</div><div class=\"canvas\">{svg}</div></div>")


# --- the page -----------------------------------------------------------------------------------

CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:0;color:#222;font-size:14px}
main{padding:8px 24px 40px}
nav{position:sticky;top:0;background:#f4f6f8;border-bottom:1px solid #ccc;padding:6px 24px;
z-index:2}
nav a{margin-right:14px;color:#2f5597;text-decoration:none}
h1{margin:16px 0 4px;font-size:22px}h2{margin-top:30px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}
th{background:#eee;position:sticky;top:30px}
table.summary td:first-child{font-weight:bold;white-space:nowrap}
table.kernels tr.off td{background:#fde2e2}
table.alts tr.chosen td{background:#e2f0d9}
code{font-size:12px}table.kernels code,.nw{white-space:nowrap}.dim{color:#777}
.caption{max-width:1000px}
.badge{font-size:10px;border-radius:3px;padding:0 4px;margin-left:4px;color:#fff}
.badge.compute{background:#c55a11}.badge.memory{background:#2e75b6}
.badge.overhead{background:#7f6000}.badge.free{background:#999}
.bar{display:inline-block;width:90px;height:9px;background:#eee;vertical-align:middle}
.bar span{display:block;height:100%;background:#2f5597}.bar.neg span{background:#c00}
details summary{cursor:pointer;white-space:nowrap}
.decision{border:1px solid #ddd;border-radius:6px;padding:4px 12px;margin:10px 0}
.decision h3{margin:6px 0}
svg.chart .grid{stroke:#ddd}svg.chart .grid.minor{stroke:#f0f0f0}
svg.chart .axis{stroke:#333}svg.chart .axis-label{font-weight:bold}
svg.chart .band{fill:#cfe8c4}svg.chart .rowbg{fill:transparent}
svg.chart .row.off .rowbg{fill:#fde2e2}svg.chart .row.off text{fill:#b00;font-weight:bold}
svg.chart .link{stroke:#555}svg.chart .pred{fill:#fff;stroke:#2f5597;stroke-width:2}
svg.chart .meas{fill:#2f5597}svg.chart .row.off .meas{fill:#c00}
.viewer{border:1px solid #bbb;margin:12px 0}
.viewer .tools{background:#f4f6f8;padding:4px 8px;border-bottom:1px solid #ccc}
.viewer button{min-width:32px;margin-left:4px}
.viewer .canvas{height:min(80vh,900px);overflow:hidden;cursor:grab;background:#fff}
.viewer .canvas svg{width:100%;height:100%;display:block}
svg.program .edge{fill:none;stroke:#999}
svg.program .group rect{fill:none;stroke-width:3;stroke-dasharray:8 4}
svg.program .group text{font-weight:bold}
svg.program .dim{fill:#444}
"""

# first in <head>: any later script error lands on <html data-script-errors> (tests read it)
ERRORS_JS = """
(function(){var el=document.documentElement,seen=[];
function note(msg){seen.push(String(msg));el.dataset.scriptErrors=String(seen.length);
el.dataset.scriptErrorMessages=seen.join(' | ');}
window.addEventListener('error',function(e){note(e.message||e);});
window.addEventListener('unhandledrejection',function(e){note(e.reason);});})();
"""

# zoom and pan by rewriting each drawing's viewBox: no library, nothing to fetch
ZOOM_JS = """
(function(){
function setup(view){
 var svg=view.querySelector('.canvas svg');if(!svg||!svg.viewBox.baseVal)return;
 var b=svg.viewBox.baseVal,all=[b.x,b.y,b.width,b.height],drag=null;
 svg.removeAttribute('width');svg.removeAttribute('height');
 svg.setAttribute('preserveAspectRatio','xMidYMin meet');
 // first view: the drawing's full width, from the top (a tall program stays readable)
 var aspect=svg.clientHeight/Math.max(1,svg.clientWidth);
 var wide=[all[0],all[1],all[2],Math.min(all[3],all[2]*aspect)||all[3]],box=wide.slice();
 function show(){svg.setAttribute('viewBox',box.join(' '));
  view.dataset.zoom=(all[2]/box[2]).toFixed(2);}
 function at(e){var p=svg.createSVGPoint();p.x=e.clientX;p.y=e.clientY;
  return p.matrixTransform(svg.getScreenCTM().inverse());}
 function zoom(f,c){box=[c.x-(c.x-box[0])/f,c.y-(c.y-box[1])/f,box[2]/f,box[3]/f];show();}
 function middle(){return {x:box[0]+box[2]/2,y:box[1]+box[3]/2};}
 svg.addEventListener('wheel',function(e){e.preventDefault();
  zoom(e.deltaY<0?1.25:0.8,at(e));},{passive:false});
 svg.addEventListener('mousedown',function(e){drag={x:e.clientX,y:e.clientY};
  e.preventDefault();});
 window.addEventListener('mousemove',function(e){if(!drag)return;
  var s=1/svg.getScreenCTM().a;box[0]-=(e.clientX-drag.x)*s;box[1]-=(e.clientY-drag.y)*s;
  drag={x:e.clientX,y:e.clientY};show();});
 window.addEventListener('mouseup',function(){drag=null;});
 view.querySelectorAll('button').forEach(function(btn){btn.addEventListener('click',function(){
  var act=btn.dataset.act;
  if(act==='width'||act==='all'){box=(act==='all'?all:wide).slice();show();}
  else zoom(act==='in'?1.5:1/1.5,middle());});});
 show();
}
document.querySelectorAll('.viewer').forEach(setup);
document.documentElement.dataset.scriptsRan='yes';
})();
"""


def render(report: Any, before: Graph, after: Graph, title: str = "eqsat-llm report",
           cost_model: Any = None) -> str:
    """The page. `before`/`after`: the captured and the optimized program; `cost_model`
    (optional, the one extraction used) prices the captured program's nodes for their hover
    text (the report prices the optimized program's)."""
    d = report.to_dict()
    inner = {"summary": summary_section(d), "kernels": kernels_section(d),
             "decisions": decisions_section(d), "accuracy": accuracy_section(d),
             "rules": rules_section(d), "ops": ops_section(d),
             "egraph": line_chart(d.get("egraph_size_per_iteration") or [], "iteration",
                                  "e-graph entries (all tables)"),
             "phases": phases_section(d),
             "programs": programs_section(before, after, d, cost_model)}
    nav = "".join(f'<a href="#{sid}">{esc(name)}</a>' for sid, name in SECTIONS)
    body = "".join(section(sid, name, inner[sid]) for sid, name in SECTIONS)
    return (f'<!DOCTYPE html>\n<html lang="en" data-script-errors="0"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><script>{ERRORS_JS}</script><style>{CSS}</style>"
            f"</head><body><nav>{nav}</nav><main><h1>{esc(title)}</h1>{body}</main>"
            f"<script>{ZOOM_JS}</script></body></html>\n")
