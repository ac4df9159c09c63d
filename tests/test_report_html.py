"""The HTML cost report: self-contained, with the tables and both programs drawn."""

from html.parser import HTMLParser

from eqsat_llm import optimize
from eqsat_llm.profile import kernel_table
from eqsat_llm.report_html import _layered_svg, render
from eqsat_llm.workloads import llama_block_case


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith("#"):
                self.external.append(value)


def test_html_report_is_self_contained_and_complete(monkeypatch):
    model, inputs = llama_block_case("decode")
    compiled = optimize(model, inputs)
    kernels = kernel_table(compiled.graph, compiled.cost_model, list(inputs), repeats=2)
    assert kernels and all(k["measured_s"] > 0 for k in kernels)
    monkeypatch.setattr("shutil.which", lambda name: None)  # the embedded drawing
    page = render(compiled.report, compiled.captured.graph, compiled.graph, kernels)
    parser = _Collect()
    parser.feed(page)
    assert parser.external == []  # nothing to fetch: one file
    assert parser.tags.count("svg") == 3  # e-graph growth, before, after
    for text in ("Kernels of the extracted program", "attention", "rms_norm", "merge-parallel"):
        assert text in page
    assert page.count('class="node"') == sum(
        1 for g in (compiled.captured.graph, compiled.graph)
        for n in g.nodes if n.id in g.live_ids() and n.op != "scalar")


def test_layered_drawing_places_inputs_above_users():
    model, inputs = llama_block_case("decode")
    g = optimize(model, inputs, measure_eager=False).graph
    svg = _layered_svg(g)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "<line" in svg
