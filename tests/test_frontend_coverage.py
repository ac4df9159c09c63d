"""Regression tests for what users' models emit that the frontend once refused or ran in torch:
the causal-mask helpers (any, full_like), layer_norm without weight or bias, gather, size-0
tensors (a full rotary leaves an empty pass-through slice), and getitem of a tuple-valued op."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from eqsat_llm import optimize


def _optimize(model, inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = optimize(model, inputs, measure_eager=False)
    return compiled, [str(w.message) for w in caught if "Fallback" in w.category.__name__]


class MaskHelpers(torch.nn.Module):
    def forward(self, x):
        blind = ~torch.any(x > 1.5, dim=-1, keepdim=True)      # aten.any.dim
        fill = torch.full_like(x, 0.5)                           # aten.full_like
        return torch.where(blind, x, fill) + torch.zeros_like(x)


class PlainLayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):  # no affine at all, and weight without bias
        return F.layer_norm(x, x.shape[-1:]) + F.layer_norm(x, (16,), self.w)


class Gather(torch.nn.Module):
    def forward(self, x, idx):
        return torch.gather(x, 1, idx) * 2.0


class FullRotary(torch.nn.Module):
    """GPT-J / NeoX / StableLM with rotary over the whole head: x[..., rot:] is empty."""

    def forward(self, x):
        rot, rest = x[..., :8], x[..., 8:]
        return torch.cat([rot * 2.0, rest], dim=-1) + rest.sum(-1, keepdim=True)


class TopK(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x, 2, dim=-1)
        return values * 2.0, indices


def test_mask_helpers_are_in_the_registry():
    x = torch.randn(3, 5, 7)
    compiled, fallbacks = _optimize(MaskHelpers(), (x,))
    assert not fallbacks and not compiled.report.fallback_ops
    torch.testing.assert_close(compiled(x), MaskHelpers()(x))


def test_layer_norm_without_weight_or_bias():
    torch.manual_seed(0)
    model, x = PlainLayerNorm(), torch.randn(2, 3, 16)
    compiled, fallbacks = _optimize(model, (x,))
    assert not compiled.report.fallback_ops, fallbacks
    assert compiled.report.op_counts_after["layer_norm"] == 2
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)


def test_gather_is_in_the_registry():
    x, idx = torch.randn(4, 6), torch.randint(0, 6, (4, 3))
    compiled, fallbacks = _optimize(Gather(), (x, idx))
    assert not compiled.report.fallback_ops, fallbacks
    torch.testing.assert_close(compiled(x, idx), Gather()(x, idx))


def test_size_0_tensors_are_carried_not_refused():
    x = torch.randn(2, 3, 8)
    compiled, _ = _optimize(FullRotary(), (x,))
    for inp in (x, torch.randn(2, 3, 8)):
        torch.testing.assert_close(compiled(inp), FullRotary()(inp))


def test_getitem_of_a_tuple_valued_op():
    x = torch.randn(3, 9)
    compiled, _ = _optimize(TopK(), (x,))
    for got, want in zip(compiled(x), TopK()(x)):
        torch.testing.assert_close(got, want)


class SliceWrites(torch.nn.Module):
    """MLA's q_pe / k_pe placed into a new tensor (empty, copy_ into slices: export writes
    them as empty, copy and slice_scatter), writes into the middle of an input, one strided."""

    def forward(self, x, pe):
        q = x.new_empty(*x.shape[:-1], 24)
        q[..., :16] = x
        q[..., 16:] = pe  # broadcast over the heads, as transformers' k_pe
        y = x.clone()
        y[:, 1:3] = x[:, 1:3].double() * 2  # written in y's dtype
        z = x.clone()
        z[..., 2:13:3] = -x[..., :4]  # every third entry (Cohere's interleaved sections)
        return q * 1.5, y, z


class Statistics(torch.nn.Module):
    """sum with a dtype (DiffLlama), var with a correction (Gemma 3n), clamp with number
    bounds, floor (Ministral 3's attention temperature)."""

    def forward(self, x):
        return (x.sum(-1, dtype=torch.float64), x.var(-1, keepdim=True, correction=0),
                x.var((0, 2)), torch.clamp(x, min=-0.5), torch.clamp(x, -0.25, 0.75),
                torch.floor(x * 3))


def test_slice_writes_are_concatenations():
    torch.manual_seed(0)
    x, pe = torch.randn(2, 4, 5, 16), torch.randn(2, 1, 5, 8)
    compiled, fallbacks = _optimize(SliceWrites(), (x, pe))
    assert not compiled.report.fallback_ops, fallbacks
    for got, want in zip(compiled(x, pe), SliceWrites()(x, pe)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_reductions_with_a_dtype_variance_clamp_and_floor():
    torch.manual_seed(0)
    x = torch.randn(3, 6, 7)
    x[0, 0, 0], x[1, 2, 3] = float("nan"), float("inf")  # through clamp and floor as torch
    compiled, fallbacks = _optimize(Statistics(), (x,))
    assert not compiled.report.fallback_ops, fallbacks
    for got, want in zip(compiled(x), Statistics()(x)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)


class ConstantTorchOp(torch.nn.Module):
    """An op the registry lacks on a constant (Gemma 3n: erfinv of its sparsity target) and on
    an input."""

    def forward(self, x):
        cutoff = torch.erfinv(torch.tensor(0.95) * 2 - 1) * 2 ** 0.5
        return x * cutoff, torch.erfinv(x.clamp(-0.9, 0.9))


def test_an_op_on_constants_is_evaluated_at_capture_not_run_in_torch():
    torch.manual_seed(0)
    x = torch.rand(3, 8) * 2 - 1
    compiled, _ = _optimize(ConstantTorchOp(), (x,))
    # the constant's erfinv is a captured constant; the input's still runs in torch
    assert compiled.report.fallback_ops == ["aten.erfinv.default"]
    assert sum(n.op == "fallback" for n in compiled.graph.nodes) == 1
    for got, want in zip(compiled(x), ConstantTorchOp()(x)):
        torch.testing.assert_close(got, want)


class LargeConstantTorchOp(torch.nn.Module):
    """An op outside the registry on a constant too large to evaluate at capture."""

    def forward(self, x):
        table = torch.erfinv(torch.full((80, 80), 0.5) * x.new_ones(()))
        return x + table[: x.shape[0], : x.shape[1]]


def test_a_large_constant_is_not_evaluated_at_capture():
    x = torch.rand(3, 8)
    compiled, _ = _optimize(LargeConstantTorchOp(), (x,))
    assert compiled.report.fallback_ops == ["aten.erfinv.default"]  # still a torch step
    torch.testing.assert_close(compiled(x), LargeConstantTorchOp()(x))
