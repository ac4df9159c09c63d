"""The HTML cost report: self-contained, every kernel in the table, the sections, charts and
zoomable drawings present, and the page run in headless Chromium with no script error."""

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.models.workloads import LlamaBlock
from eqsat_llm.profile import attach_profile, profile_program
from eqsat_llm.reporting.html import SECTIONS, render
from eqsat_llm.reporting.program_drawing import dot_titles, graph_dot, layered_svg
from eqsat_llm.reporting.report import Report
from eqsat_llm.reporting.units import fmt_bytes, fmt_count, fmt_seconds, fmt_us

SECTION_IDS = [sid for sid, _ in SECTIONS]


@pytest.fixture(scope="module")
def block():
    """The LLaMA-style block at decode, small (d_model 64) to keep the tests quick, profiled
    on the C backend (few repeats: the figures are rendered, not judged)."""
    model = LlamaBlock(d_model=64, n_heads=2, ffn=128, max_seq=16).eval()
    x = torch.randn(1, 1, 64)
    compiled = optimize(model, (x,), measure_eager=False)
    attach_profile(compiled.report, profile_program(compiled, [x], repeats=3))
    return compiled


@pytest.fixture(scope="module")
def page(block):
    return render(block.report, block.captured.graph, block.graph, title="block decode",
                  cost_model=block.cost_model)


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id":
                self.ids.add(value)
            if name in ("src", "href", "xlink:href") and value and not value.startswith("#"):
                self.external.append(value)


def _parsed(page):
    parser = _Collect()
    parser.feed(page)
    return parser


def test_page_is_self_contained_with_every_section_and_kernel(block, page):
    parser = _parsed(page)
    assert parser.external == [] and "url(" not in page and "@import" not in page
    assert set(SECTION_IDS) <= parser.ids
    kernel_ids = [k["id"] for k in block.report.kernels]
    assert kernel_ids and {f"kernel-{i}" for i in kernel_ids} <= parser.ids
    assert "addEventListener('wheel'" in page and page.count('class="viewer"') == 2
    assert 'svg xmlns="http://www.w3.org/2000/svg" class="chart accuracy"' in page
    profile = block.report.profile
    assert f"measured / predicted: median <b>{profile['median_ratio']:.2f}x</b>" in page
    assert page.count('class="off"') == sum(  # flagged rows highlighted
        k["flagged"] * len(k["node_ids"]) for k in profile["kernels"])
    assert page.count('<g class="row') == len(profile["kernels"])  # a row per backend kernel


def test_decisions_show_the_alternatives_of_the_merged_qkv_and_attention(block, page):
    """The block's merged QKV projection (gemm[rms_norm]) and attention were chosen among
    alternatives: both get a decision box with each alternative's term and predicted cost."""
    parser = _parsed(page)
    for label in ("gemm[rms_norm]", "attention"):
        k = next(k for k in block.report.kernels if k["label"] == label)
        assert k["alternatives"], label
        assert f"decision-{k['id']}" in parser.ids
        before = page[:page.index(f'id="decision-{k["id"]}"')]
        assert before.count("<details") == before.count("</details>")  # shown, not folded
        box = page[page.index(f'id="decision-{k["id"]}"'):]
        box = box[:box.index("</table>")]
        for alt in k["alternatives"]:
            assert html.escape(alt["term"]) in box and fmt_us(alt["own_us"]) in box


def test_drawings_have_hover_titles_and_fused_outlines(block, page):
    drawn = sum(1 for g in (block.captured.graph, block.graph)
                for n in g.nodes if n.id in g.live_ids() and n.op != "scalar")
    if shutil.which("dot") is None:  # the embedded drawing: a <g class="node"> per node
        assert page.count('<g class="node"') == drawn
    titles = re.findall(r'class="node"[^>]*>\s*<title>([^<]*)</title>', page)
    assert len(titles) == drawn
    assert all("dtype" in t and "cost:" in t for t in titles)
    fused = [k for k in block.report.profile["kernels"] if len(k["node_ids"]) > 1]
    assert fused and all(f"backend kernel {k['name']}:" in page for k in fused)


def test_unprofiled_report_without_alternatives_renders(block):
    """A report with nothing optional (no profile, no alternatives, no rules) still renders,
    saying what is missing."""
    bare = Report(kernels=[{**k, "alternatives": [], "rules": []} for k in block.report.kernels])
    page = render(bare, block.captured.graph, block.graph)
    assert set(SECTION_IDS) <= _parsed(page).ids
    assert "Not profiled" in page and "No fused groups outlined" in page
    assert "No kernel's e-class held an alternative" in page
    untimed = {"backend": "triton", "repeats": 20, "statistic": "median",
               "reason": "under Triton's interpreter nothing is timed", "median_ratio": None,
               "worst_ratio": None, "worst_kernel": None, "flagged": 0,
               "total_predicted_us": 1.0, "total_measured_us": None,
               "kernels": [{"name": "k1", "node_ids": [bare.kernels[0]["id"]], "ops": "gemm",
                            "predicted_us": 1.0, "measured_us": None, "ratio": None,
                            "flagged": False, "reason": None}]}
    bare.profile = untimed
    page = render(bare, block.captured.graph, block.graph)
    assert "nothing is timed" in page and page.count('<g class="row') == 1


def test_graphviz_titles_replace_node_names(block):
    """dot names a node n<id> and a cluster cluster_<i> in its <title>: both become the hover
    text (checked on dot's output shape; the drawing itself needs graphviz installed)."""
    g = block.graph
    node = next(n for n in g.nodes if n.op == "attention")
    groups = [{"name": "k_fused", "node_ids": [node.id, *node.inputs[:1]]}]
    dot = graph_dot(g, "after", {node.id: "1 us (compute)"}, groups)
    assert "subgraph cluster_0" in dot and f"n{node.id} [label=" in dot
    svg = (f'<svg><g id="clust1" class="cluster"><title>cluster_0</title></g>'
           f'<g id="node1" class="node"><title>n{node.id}</title></g></svg>')
    out = dot_titles(svg, g, {node.id: "1 us (compute)"}, groups)
    assert "backend kernel k_fused" in out and f"#{node.id} attention" in out
    assert "cost: 1 us (compute)" in out


def test_layered_drawing_places_inputs_above_users(block):
    svg = layered_svg(block.graph)
    ys = {int(m[0]): float(m[1]) for m in re.findall(r'data-node="(\d+)"><title>[^<]*</title>'
                                                    r'<rect x="[\d.]+" y="([\d.]+)"', svg)}
    edges = [(i, n.id) for n in block.graph.nodes if n.id in ys for i in n.inputs if i in ys]
    assert edges and all(ys[i] < ys[j] for i, j in edges)


def test_units():
    assert [fmt_bytes(n) for n in (12, 1536, 12288, 25166753, 3 * 2**30)] == [
        "12 B", "1.5 KiB", "12 KiB", "24 MiB", "3 GiB"]
    assert [fmt_us(u) for u in (0.42, 32.77, 150.06, 1500, 2.5e6)] == [
        "0.42 us", "32.8 us", "150 us", "1.5 ms", "2.5 s"]
    assert fmt_seconds(0.0152) == "15.2 ms" and fmt_us(None) == "-"
    assert fmt_count(1573888, "FLOP") == "1.57 MFLOP" and fmt_count(766) == "766"


# clicks "+" in each drawing and scrolls up once over it: the zoom script must follow
ZOOM_PROBE = """<script>
document.querySelectorAll('.viewer').forEach(function(v){
 v.querySelector('button[data-act="in"]').click();
 var svg=v.querySelector('svg'),r=svg.getBoundingClientRect();
 svg.dispatchEvent(new WheelEvent('wheel',{deltaY:-100,clientX:r.left+10,clientY:r.top+10,
  bubbles:true,cancelable:true}));
 v.dataset.probed=v.dataset.zoom;});
</script></body>"""


def test_page_runs_in_headless_chromium(block, page, tmp_path):
    """A real browser loads the page and runs its scripts: every section and kernel row is in
    the DOM, the charts are there, the drawings zoom, and no script error was recorded.
    (scripts/check_report_html keeps a screenshot for a person to look at.)"""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does)")
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", ZOOM_PROBE))
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000",
         "--virtual-time-budget=3000", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-scripts-ran="yes"' in html_tag  # the page's scripts ran to their end
    assert 'data-script-errors="0"' in html_tag, html_tag
    ids = _parsed(dom).ids
    assert set(SECTION_IDS) <= ids
    assert {f"kernel-{k['id']}" for k in block.report.kernels} <= ids
    assert 'class="chart accuracy"' in dom and 'class="chart"' in dom
    zooms = re.findall(r'class="viewer" id="program-\w+" data-zoom="([\d.]+)" '
                       r'data-probed="([\d.]+)"', dom)
    assert len(zooms) == 2 and all(float(z) > 1.8 for _, z in zooms), zooms  # 1.5 x 1.25
