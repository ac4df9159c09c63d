"""The worked example of docs/rules.md runs as the guide says."""

import importlib.util
from pathlib import Path

import torch

from eqsat_llm import optimize
from eqsat_llm.models.workloads import gpt2_case

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "gelu_tanh_rule.py"


def load_example():
    spec = importlib.util.spec_from_file_location("gelu_tanh_rule", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worked_example_fires_on_gpt2():
    example = load_example()
    model, inputs = gpt2_case()
    # the library's fusion family has the same rule; leave it out so the example's fires
    compiled = optimize(model, inputs, rules=["layout", "algebra", example])
    ops = compiled.graph.op_counts()
    assert ops["gelu"] == 2 and ops["tanh"] == 0  # one per layer
    stats = {r.name: r for r in compiled.report.rules}
    assert stats["gelu-tanh"].matches == 2 and stats["gelu-tanh"].family == "example-gelu"
    with torch.no_grad():
        assert (compiled(*inputs) - model(*inputs)).abs().max().item() <= 1e-5
