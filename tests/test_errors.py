"""Bad input gets a clear error."""

import pytest
import torch

from eqsat_llm import CaptureError, EqsatError, GraphError, optimize
from eqsat_llm.ir import Graph, TensorType


class Tiny(torch.nn.Module):
    def forward(self, x):
        return (x * 2.0).view(-1)


def test_wrong_input_shape_is_refused():
    compiled = optimize(Tiny(), (torch.randn(2, 3),))
    with pytest.raises(EqsatError, match=r"input 0: expected float32\[2, 3\]"):
        compiled(torch.randn(3, 3))
    assert torch.equal(compiled(torch.ones(2, 3)), torch.full((6,), 2.0))


def test_not_a_model():
    with pytest.raises(CaptureError, match="expected an nn.Module"):
        optimize(lambda x: x, (torch.randn(2),))


def test_unknown_backend_and_family():
    with pytest.raises(EqsatError, match="unknown backend"):
        optimize(Tiny(), (torch.randn(2, 3),), backend="fpga")
    with pytest.raises(EqsatError, match="unknown rule family"):
        optimize(Tiny(), (torch.randn(2, 3),), rules=["nonsense"])


def test_ill_typed_node_is_refused():
    g = Graph()
    a = g.append("input", (), {"name": "a", "index": 0}, TensorType((2, 3), "float32"))
    b = g.append("input", (), {"name": "b", "index": 1}, TensorType((4, 5), "float32"))
    with pytest.raises(GraphError, match="does not type-check"):
        g.add("mm", (a, b), alpha=1.0)
    with pytest.raises(GraphError, match="unknown op"):
        g.add("frobnicate", (a,))
    with pytest.raises(GraphError, match="missing attribute"):
        g.add("view", (a,))
