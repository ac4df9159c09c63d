"""bf16 / fp16 models on the C backend: computed in float32 (eqsat_llm/formats/half.py), GEMM
weights held in the model's dtype, inputs and outputs in it, within the dtype's tolerance of
eager; combined with quantize=; a float32 model whose weights are half values; and the pass
alone, as a graph-to-graph function."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.formats.half import FORMAT_OF, compute_in_float32, has_half
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.model_matrix import build

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
# max |compiled - eager| / max |eager| on the small configs' logits: eager rounds every op to
# the half dtype, the program once at its outputs
TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}


def test_the_pass_widens_values_and_keeps_the_interface():
    g = Graph()
    x = g.append("input", (), {"name": "x", "index": 0}, TensorType((2, 4), "bfloat16"))
    g.constants["w"] = torch.randn(4, 3).to(torch.bfloat16)
    w = g.append("param", (), {"name": "w"}, TensorType((4, 3), "bfloat16"))
    y = g.add("matmul", (x, w), alpha=1.0)
    z = g.add("to_dtype", (g.add("relu", (y,)),), dtype="bfloat16")
    g.outputs = [z]
    out = compute_in_float32(g)
    assert has_half(g) and out.node(out.outputs[0]).type == TensorType((2, 3), "bfloat16")
    inner = [n for n in out.nodes if n.op in ("matmul", "relu")]
    assert all(n.type.dtype == "float32" for n in inner)
    xs = [torch.randn(2, 4).to(torch.bfloat16)]
    want = ReferenceRuntime(g).run(xs)[0].float()
    got = ReferenceRuntime(out).run(xs)[0]
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 0.05 * want.abs().max()


def _half(model: torch.nn.Module, inputs: tuple, dtype: torch.dtype):
    return model.to(dtype), tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_half_models_compile_to_c_within_tolerance(family, dtype):
    model, inputs = _half(*build(family, seq=16, size="small"), dtype)
    compiled = optimize(model, inputs, measure_eager=False)
    report = compiled.report
    assert report.backend == "c" and report.computed_in_float32
    # the program is C but for the conversions at its edges (no C type for half values)
    assert set(report.torch_ops) <= {"to_dtype"}, report.torch_ops
    # every GEMM reads its weight in the model's dtype (rules/half_weights.py)
    gemms = sum(n for op, n in report.op_counts_after.items() if op.startswith("gemm"))
    assert report.weight_formats == {FORMAT_OF[str(dtype)[6:]]: gemms}, report.weight_formats
    assert "attention" in report.op_counts_after
    with torch.no_grad():
        want, got = model(*inputs), compiled(*inputs)
    assert got.dtype == dtype and got.shape == want.shape
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    assert err <= TOLERANCE[dtype], err


@needs_cc
def test_bf16_model_with_int8_weights():
    model, inputs = _half(*build("llama", seq=16, size="small"), torch.bfloat16)
    compiled = optimize(model, inputs, quantize="int8", measure_eager=False)
    q = compiled.report.quantization
    assert compiled.report.backend == "c" and q.quantized_weights > 0
    assert q.outputs[0].max_rel <= 0.1 and q.outputs[0].top1_agreement >= 0.7, q.summary()


@needs_cc
def test_float32_model_with_half_values_keeps_them_half():
    # a bf16 checkpoint loaded as float32: the same values in half the bytes, exactly
    model, inputs = build("llama", seq=1, size="small")
    exact = optimize(model.to(torch.bfloat16).float(), inputs, measure_eager=False)
    plain = optimize(build("llama", seq=1, size="small")[0], inputs, measure_eager=False)
    gemms = sum(n for op, n in exact.report.op_counts_after.items() if op.startswith("gemm"))
    # a bf16 value in float16's range is exact in float16 too: the two formats cost the same,
    # so which one a GEMM gets is a tie (broken by rule order); each weight keeps 2 bytes
    formats = exact.report.weight_formats
    assert set(formats) <= {"bf16", "fp16"} and sum(formats.values()) == gemms
    assert not exact.report.torch_ops
    assert "bf16" not in plain.report.weight_formats  # ordinary float32 weights stay float32
    with torch.no_grad():
        want, got = model(*inputs), exact(*inputs)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_a_float32_models_explicit_cast_to_half_rounds_as_eager():
    # found by the fuzzer: x == x.half().float() answered True everywhere when the cast pair
    # was dropped; a float32 model's explicit cast keeps its rounding
    class RoundTrip(torch.nn.Module):
        def forward(self, x):
            y = x.to(torch.float16).float()
            return x == y, y - x

    x = torch.randn(4, 8)
    want = RoundTrip()(x)
    for backend in ("c", "reference"):
        got = optimize(RoundTrip(), (x,), backend=backend, measure_eager=False)(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
