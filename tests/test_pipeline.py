"""End to end: optimize the reference workloads and compare with eager PyTorch."""

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.api import optimize_graph
from eqsat_llm.rulebook import resolve

from .conftest import max_error

LAYOUT_OPS = ("view", "permute", "expand", "unsqueeze", "clone", "transpose")


def test_optimized_program_equals_eager(workload):
    name, model, inputs, _ = workload
    compiled = optimize(model, inputs)
    with torch.no_grad():
        expected, got = model(*inputs), compiled(*inputs)
    assert max_error(expected, got) <= 1e-5, name
    # and on fresh random inputs of the same shapes, not only the example ones
    fresh = tuple(torch.randn_like(x) if x.is_floating_point() else x for x in inputs)
    with torch.no_grad():
        assert max_error(model(*fresh), compiled(*fresh)) <= 1e-5, name


def test_first_ruleset_removes_redundant_layout_chains(workload):
    name, _, _, captured = workload
    from eqsat_llm.report import Report

    report = Report()
    optimize_graph(captured.graph, resolve(None), report=report)
    before, after = report.op_counts_before, report.op_counts_after
    assert before["expand"] > 0 and after["expand"] < before["expand"], name
    assert after["view"] < before["view"] or after["unsqueeze"] < before["unsqueeze"], name
    layout_before = sum(before[o] for o in LAYOUT_OPS)
    layout_after = sum(after[o] for o in LAYOUT_OPS)
    assert layout_after < layout_before, (name, layout_before, layout_after)
    assert sum(after.values()) < sum(before.values())
    fired = {r.name for r in report.rules if r.matches}
    assert {"expand-noop", "view-view"} <= fired, fired
    assert report.stop_reason == "saturated"


def test_attention_scale_is_folded_into_the_matmul():
    from eqsat_llm.workloads import llama_block_case

    model, inputs = llama_block_case("prefill")
    compiled = optimize(model, inputs)
    ops = compiled.graph.op_counts()
    assert ops["div"] == 0
    scales = sorted(n.attrs["alpha"] for n in compiled.graph.nodes if n.op == "bmm")
    assert scales == [0.125, 1.0]  # 1/sqrt(head_dim 64) on q@k^T; p@v unscaled


def test_report_has_phases_counts_and_rules(workload):
    _, model, inputs, _ = workload
    report = optimize(model, inputs).report
    d = report.to_dict()
    for phase in ("capture", "encode", "saturate", "extract", "decode"):
        assert d["timings"][phase] >= 0
    assert d["nodes_after"] < d["nodes_before"]
    assert d["iterations"] >= 1 and d["eclasses"] > 0 and d["enodes"] >= d["eclasses"]
    assert d["cost_after"] < d["cost_before"]
    assert any(r["matches"] > 0 for r in d["rules"])
    text = report.summary()
    assert "rules fired" in text and "expand" in text


def test_no_rules_keeps_the_program():
    from eqsat_llm.workloads import llama_block_case

    model, inputs = llama_block_case("decode")
    compiled = optimize(model, inputs, rules=[])
    assert compiled.report.iterations == 0
    from eqsat_llm.codegen import ReferenceRuntime

    with torch.no_grad():
        captured = ReferenceRuntime(compiled.captured.graph).run(list(inputs))
        got = compiled(*inputs)
        # bit-identical to the captured program; eager uses other kernels (matmul vs mm)
        assert max_error(tuple(captured), got) == 0.0
        assert max_error(model(*inputs), got) <= 1e-5


def _stack_round_trip(depth: int) -> None:
    from eqsat_llm.workloads import stacked_llama_blocks

    model = stacked_llama_blocks(depth).eval()
    x = torch.randn(1, 16, 512, generator=torch.Generator().manual_seed(1))
    compiled = optimize(model, (x,))
    with torch.no_grad():
        assert max_error(model(x), compiled(x)) <= 1e-5
    assert compiled.report.op_counts_after["expand"] == 0
    assert set(compiled.report.timings) >= {"capture", "encode", "saturate", "extract"}


def test_deep_stack_encodes_and_extracts_without_recursion():
    _stack_round_trip(8)  # ~770 ops deep


@pytest.mark.slow
def test_32_layer_stack():
    _stack_round_trip(32)  # ~3000 ops; timings in benchmarks/RESULTS.md
