"""The extraction cost report as one self-contained HTML page.

Sections: the summary (ops, predicted cost, lower bound, e-graph size, memory), the per-kernel
table of the extracted program, the rules (matches, used), the e-graph size over the
iterations, the time per phase, and the program before and after, drawn as graphs: with
graphviz's `dot` where it is installed, otherwise by an embedded layered drawing.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from typing import Any

from .ir import Graph, TensorType

COLORS = {"matmul": "#f4b183", "attention": "#ff8c8c", "reduction": "#a9d18e",
          "elementwise": "#9dc3e6", "layout": "#d9d9d9", "source": "#ffffff",
          "fallback": "#ffd966"}


def _label(graph: Graph, node_id: int) -> str:
    n = graph.node(node_id)
    t = n.type
    shape = "x".join(map(str, t.shape)) if isinstance(t, TensorType) else "tuple"
    name = n.attrs.get("name") if n.op in ("input", "param", "const") else None
    return f"{n.op}{' ' + str(name) if name else ''}\n{shape}"


def _category(op: str) -> str:
    from .ops import REGISTRY

    return REGISTRY[op].category if op in REGISTRY else "fallback"


def graph_dot(graph: Graph, title: str) -> str:
    live = graph.live_ids()
    lines = [f'digraph "{title}" {{', ("rankdir=TB; node [shape=box, style=filled, "
             'fontname="Helvetica", fontsize=10];')]
    for n in graph.nodes:
        if n.id in live and n.op != "scalar":
            label = _label(graph, n.id).replace("\n", "\\n").replace('"', "'")
            lines.append(f'n{n.id} [label="{label}", fillcolor="{COLORS[_category(n.op)]}"];')
    for n in graph.nodes:
        if n.id in live:
            for i in n.inputs:
                if graph.node(i).op != "scalar":
                    lines.append(f"n{i} -> n{n.id};")
    lines.append("}")
    return "\n".join(lines)


def graph_svg(graph: Graph, title: str) -> str:
    """SVG of the program: graphviz if `dot` is on PATH, else a layered drawing of our own."""
    dot = shutil.which("dot")
    if dot:
        try:
            out = subprocess.run([dot, "-Tsvg"], input=graph_dot(graph, title), text=True,
                                 capture_output=True, timeout=60, check=True).stdout
            return out[out.index("<svg"):]
        except (subprocess.SubprocessError, ValueError):
            pass  # fall back to the embedded drawing
    return _layered_svg(graph)


def _layered_svg(graph: Graph) -> str:
    live = graph.live_ids()
    nodes = [n for n in graph.nodes if n.id in live and n.op != "scalar"]
    depth: dict[int, int] = {}
    for n in nodes:  # nodes are in topological order
        ins = [depth[i] for i in n.inputs if i in depth]
        depth[n.id] = 1 + max(ins) if ins else 0
    layers: dict[int, list[int]] = {}
    for n in nodes:
        layers.setdefault(depth[n.id], []).append(n.id)
    w, h, gap_x, gap_y = 150, 34, 20, 30
    width = max(len(v) for v in layers.values()) * (w + gap_x) + gap_x
    height = len(layers) * (h + gap_y) + gap_y
    pos = {nid: (gap_x + k * (w + gap_x), gap_y + d * (h + gap_y))
           for d, ids in layers.items() for k, nid in enumerate(ids)}
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="Helvetica" font-size="10">')]
    for n in nodes:
        x1, y1 = pos[n.id]
        for i in n.inputs:
            if i in pos:
                x0, y0 = pos[i]
                parts.append(f'<line x1="{x0 + w / 2}" y1="{y0 + h}" x2="{x1 + w / 2}" '
                             f'y2="{y1}" stroke="#888"/>')
    for n in nodes:
        x, y = pos[n.id]
        color = COLORS[_category(n.op)]
        top, bottom = _label(graph, n.id).split("\n")
        parts.append(f'<g class="node"><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" '
                     f'fill="{color}" stroke="#333"/><text x="{x + 6}" y="{y + 14}">'
                     f"{html.escape(top[:26])}</text><text x=\"{x + 6}\" y=\"{y + 27}\" "
                     f'fill="#444">{html.escape(bottom[:26])}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _line_chart(values: list[int]) -> str:
    if not values:
        return ""
    w, h, pad = 480, 160, 30
    top = max(values) or 1
    step = (w - 2 * pad) / max(1, len(values) - 1)
    pts = " ".join(f"{pad + i * step:.1f},{h - pad - (v / top) * (h - 2 * pad):.1f}"
                   for i, v in enumerate(values))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'font-family="Helvetica" font-size="10"><polyline points="{pts}" fill="none" '
            f'stroke="#2f5597" stroke-width="2"/><text x="{pad}" y="15">max {top} entries'
            f'</text><text x="{pad}" y="{h - 8}">iteration 0 .. {len(values) - 1}</text></svg>')


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


CSS = ("body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222}"
       "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;"
       "padding:3px 8px;font-size:13px;text-align:left}th{background:#eee}"
       ".graphs{display:flex;gap:24px;align-items:flex-start}"
       ".graphs div{flex:1 1 50%;min-width:0}.graphs svg{max-width:100%;height:auto}"
       "h2{margin-top:28px}")


def render(report: Any, before: Graph, after: Graph, kernels: list[dict[str, Any]],
           title: str = "eqsat-llm report") -> str:
    d = report.to_dict()
    summary = [["ops", f"{d['nodes_before']} -> {d['nodes_after']}"],
               ["predicted cost", f"{d['cost_before']:.6g} -> {d['cost_after']:.6g}"],
               ["lower bound / gap", f"{d.get('lower_bound')} / {d.get('gap')}"],
               ["extraction", d["extraction_method"]],
               ["e-graph", (f"{d['eclasses']} classes, {d['enodes']} nodes, {d['iterations']} "
                           f"iterations, stopped: {d['stop_reason']}")],
               ["constants folded", f"{d['folded_constants']} ({d['folded_bytes']} bytes)"],
               ["fallback ops", ", ".join(d["fallback_ops"]) or "none"]]
    for k, v in d.get("memory", {}).items():
        summary.append([f"memory: {k}", v])
    kernel_head = ["#", "op", "inputs", "output", "flops", "bytes", "predicted us",
                   "measured us"]
    kernel_rows = [[k["id"], k["op"], k["inputs"], k["output"], k.get("flops", ""),
                    k.get("bytes", ""), _us(k.get("predicted_s")), _us(k.get("measured_s"))]
                   for k in kernels]
    rules = [[r["name"], r["family"], r["soundness"], r["matches"],
              "yes" if r["used"] else "no"] for r in d["rules"] if r["matches"]]
    ops = sorted(set(d["op_counts_before"]) | set(d["op_counts_after"]))
    op_rows = [[o, d["op_counts_before"].get(o, 0), d["op_counts_after"].get(o, 0)]
               for o in ops]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
{_table(["", ""], summary)}
<h2>Kernels of the extracted program</h2>
{_table(kernel_head, kernel_rows)}
<h2>Rules</h2>
{_table(["rule", "family", "soundness", "matches", "used"], rules)}
<h2>Ops before and after</h2>
{_table(["op", "before", "after"], op_rows)}
<h2>E-graph size over the iterations</h2>
{_line_chart(d["egraph_size_per_iteration"])}
<h2>Time per phase</h2>
{_table(["phase", "ms"], [[k, f"{v * 1000:.1f}"] for k, v in d["timings"].items()])}
<h2>Program before and after</h2>
<div class="graphs"><div><h3>before</h3>{graph_svg(before, "before")}</div>
<div><h3>after</h3>{graph_svg(after, "after")}</div></div>
</body></html>
"""


def _us(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e6:.1f}"
