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


def test_page_renders_in_headless_chromium(tmp_path):
    """A real browser loads the page, lays it out and draws it (scripts/check_report_html
    keeps the screenshot for a person to look at)."""
    import shutil
    import subprocess

    import pytest

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    model, inputs = llama_block_case("decode")
    compiled = optimize(model, inputs, measure_eager=False)
    page = tmp_path / "report.html"
    page.write_text(render(compiled.report, compiled.captured.graph, compiled.graph,
                           kernel_table(compiled.graph, compiled.cost_model)))
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "report.png"
    subprocess.run(flags + ["--window-size=1400,4200", f"--screenshot={shot}",
                            page.as_uri()], capture_output=True, timeout=120, check=True)
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 100_000  # a page, not a blank
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert dom.count("<svg") == 3 and dom.count('class="node"') > 50
