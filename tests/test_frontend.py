"""The frontend accepts an nn.Module, an fx.GraphModule and an ExportedProgram."""

import pytest
import torch

from eqsat_llm import Limits, optimize
from eqsat_llm.models.workloads import llama_block_case


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))).transpose(0, 1).transpose(0, 1)


@pytest.mark.parametrize("form", ["module", "graph_module", "exported"])
def test_accepts_each_model_form(form):
    torch.manual_seed(0)
    model, x = Mlp().eval(), torch.randn(4, 16)
    if form == "graph_module":
        model_in = torch.fx.symbolic_trace(model)
    elif form == "exported":
        model_in = torch.export.export(model, (x,))
    else:
        model_in = model
    compiled = optimize(model_in, (x,))
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-6, rtol=0)
    assert compiled.graph.op_counts()["transpose"] == 0  # transpose of transpose cancelled


def test_saturation_limits_stop_gracefully():
    model, inputs = llama_block_case("decode")
    compiled = optimize(model, inputs, limits=Limits(iterations=1))
    assert compiled.report.stop_reason == "iteration_limit"
    assert compiled.report.iterations == 1
    with torch.no_grad():
        assert (compiled(*inputs) - model(*inputs)).abs().max().item() <= 1e-5
    tiny = optimize(model, inputs, limits=Limits(enodes=10))
    assert tiny.report.stop_reason == "enode_limit"


def test_progress_is_reported():
    model, inputs = llama_block_case("decode")
    lines: list[str] = []
    optimize(model, inputs, progress=lines.append)
    assert lines and lines[0].startswith("iteration 1:")


def test_max_dim_values_are_amax_and_indices_argmax():
    # attention sinks (GPT-OSS): the row max of max.dim subtracted before a softmax; the values
    # alone are amax (the softmax then drops the shift: rule softmax-less-row-max), the
    # indices argmax (a router's choice: PhiMoE), both in C
    class Sinks(torch.nn.Module):
        def forward(self, x, y):
            s = torch.cat([x, y], -1)
            p = torch.softmax(s - s.max(-1, keepdim=True).values, -1)[..., :-1]
            return p, torch.min(x, 1).values, torch.max(x, -1).indices

    x, y = torch.randn(2, 3, 5), torch.randn(2, 3, 1)
    compiled = optimize(Sinks(), (x, y), measure_eager=False)
    assert compiled.report.torch_ops == {} and not compiled.report.fallback_ops
    ops = compiled.report.op_counts_after
    assert "amax" not in ops and ops["argmax"] == 1  # the shift is gone
    assert "amin" in ops
    for got, want in zip(compiled(x, y), Sinks()(x, y)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        assert got.dtype == want.dtype


def test_repeat_is_converted_to_layout_ops_and_runs_in_c():
    # x.repeat(r): view, expand, view (BLOOM's ALiBi): no torch step, eager's values
    class Tile(torch.nn.Module):
        def forward(self, x, y):
            return x.repeat(2, 3) * 2, y.repeat(2, 1, 1, 2) + 1, x.repeat(1, 1)

    x, y = torch.randn(3, 5), torch.randn(2, 3, 4)
    compiled = optimize(Tile(), (x, y), measure_eager=False)
    assert not compiled.report.fallback_ops, compiled.report.fallback_ops
    assert not compiled.report.torch_ops, compiled.report.torch_ops
    for got, want in zip(compiled(x, y), Tile()(x, y)):
        assert torch.equal(got, want)
