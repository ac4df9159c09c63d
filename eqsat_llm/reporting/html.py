"""The extraction cost report as one self-contained HTML page: what the optimizer chose, why,
and how far its cost model was from the clock.

Everything comes from `report.to_dict()` (docs/report.md); the two programs are drawn from
their IR graphs. Sections, each with a stable id: summary, kernels (every kernel of the
optimized program with its alternatives), decisions (the kernels whose e-class held
alternatives, with their predicted costs), accuracy (predicted against measured time per
backend kernel, when profiled), rules, ops, egraph (growth over the iterations), phases and
programs (before and after, zoomable SVG: graphviz's `dot` where it is installed, otherwise
an embedded layered drawing; hover a node for its shape, dtype and cost; the backend kernels
that cover several nodes are outlined). No external fetch: CSS and scripts
(reporting/page/: report.css, script_errors.js, zoom.js) are inlined, and the first script
records any script error on `<html data-script-errors>` for tests to read. The sections are
html_sections.py's, the charts svg_charts.py's, the drawings program_drawing.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ir import Graph
from .html_pieces import esc, section
from .html_sections import (
    accuracy_section,
    decisions_section,
    kernels_section,
    ops_section,
    phases_section,
    rules_section,
    summary_section,
)
from .program_drawing import programs_section
from .svg_charts import line_chart

SECTIONS = (("summary", "Summary"), ("kernels", "Kernels"), ("decisions", "Decisions"),
            ("accuracy", "Predicted against measured"), ("rules", "Rules"),
            ("ops", "Op counts"), ("egraph", "E-graph growth"), ("phases", "Time per phase"),
            ("programs", "Programs before and after"))


def _asset(name: str) -> str:
    return (Path(__file__).parent / "page" / name).read_text()


CSS, ERRORS_JS, ZOOM_JS = _asset("report.css"), _asset("script_errors.js"), _asset("zoom.js")


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
