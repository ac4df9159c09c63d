"""torch.compile(model, backend="eqsat_llm")."""

import copy
import warnings

import pytest
import torch

from eqsat_llm.api import Compiled, EagerFallbackWarning
from eqsat_llm.models.workloads import llama_block_case


def test_backend_is_registered():
    import eqsat_llm  # noqa: F401

    assert "eqsat_llm" in torch._dynamo.list_backends()


def test_torch_compile_runs_the_block(monkeypatch):
    calls = []
    original = Compiled.__call__

    def counting_call(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Compiled, "__call__", counting_call)
    torch._dynamo.reset()
    model, inputs = llama_block_case("decode")
    compiled = torch.compile(model, backend="eqsat_llm")
    with torch.no_grad():
        got, expected = compiled(*inputs), model(*inputs)
    assert calls, "the eqsat_llm program did not run"
    assert (got - expected).abs().max().item() <= 1e-5
    torch._dynamo.reset()


# -- new shapes: dynamo's dynamic graphs are specialised per concrete shape -------------------

class FlattenRows(torch.nn.Module):
    """Reads its input's sizes: under dynamic shapes the graph takes them as SymInts."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.proj(x)).reshape(x.shape[0], -1) * 0.5


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4))


def _compile(model, mode):
    return torch.compile(model, backend="eqsat_llm", dynamic=True if mode == "dynamic" else None)


def _input(shape, mode):
    x = torch.randn(*shape)
    if mode == "mark_dynamic":
        torch._dynamo.mark_dynamic(x, 0)
    return x


@pytest.mark.parametrize("mode", ["automatic", "dynamic", "mark_dynamic"])
@pytest.mark.parametrize("case", ["mlp", "shape"])
def test_new_shapes_recompile_and_reuse_their_programs(case, mode, monkeypatch):
    from eqsat_llm import api

    optimized = []
    original = api.optimize

    def counting_optimize(model, inputs, **kwargs):
        optimized.append(tuple(tuple(t.shape) for t in inputs))
        return original(model, inputs, **kwargs)

    monkeypatch.setattr(api, "optimize", counting_optimize)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = (_mlp() if case == "mlp" else FlattenRows()).eval()
    compiled = _compile(model, mode)
    shapes = [(2, 8), (3, 8), (5, 8)] if case == "mlp" else [(2, 3, 8), (4, 3, 8), (5, 3, 8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        with torch.no_grad():
            for shape in shapes + shapes[1:]:
                x = _input(shape, mode)
                got, expected = compiled(x), model(x)
                assert got.shape == expected.shape
                assert (got - expected).abs().max().item() <= 1e-5, shape
                if shape == shapes[-1]:
                    first_round = len(optimized)
    assert len(optimized) == first_round, "calling back with earlier shapes optimized again"
    assert first_round <= len(shapes)
    torch._dynamo.reset()


def test_a_graph_that_does_not_specialise_runs_in_eager_with_one_warning():
    def f(x):
        return x * 2.0, x.shape[0] + 1  # a SymInt output: not a program of tensors

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eqsat_llm", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 3):
            x = torch.randn(n, 7)
            got, expected = compiled(x), f(x)
            assert torch.allclose(got[0], expected[0]) and got[1] == expected[1]
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    assert "eager" in str(fallbacks[0].message)
    torch._dynamo.reset()


def test_state_written_in_place_under_new_shapes():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count += 1
            return x * self.count

    torch._dynamo.reset()
    model = Counter()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="eqsat_llm")
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        with torch.no_grad():
            for n in (2, 3, 4):
                x = torch.randn(n, 5)
                assert (compiled(x) - eager(x)).abs().max().item() <= 1e-5
                assert model.count.item() == eager.count.item() == n - 1
    torch._dynamo.reset()
