"""The programs before and after, drawn: graphviz's `dot` where it is installed, otherwise an
embedded layered layout; each node with its shape, dtype and cost on hover, the backend
kernels that cover several nodes outlined, in a zoomable viewer."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from ..extraction.cost import constant_nodes
from ..extraction.costmodel import CostError, nbytes
from ..ir import VALUE_LEAVES, Graph, Node, TensorType, node_label
from .html_pieces import COLORS, GROUP_COLORS, category, esc, fused_groups
from .svg_charts import svg_open
from .units import fmt_bytes, fmt_us

# --- the programs -------------------------------------------------------------------------------

def drawn_nodes(graph: Graph) -> list[Node]:
    live = graph.live_ids()
    return [n for n in graph.nodes if n.id in live and n.op != "scalar"]


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
