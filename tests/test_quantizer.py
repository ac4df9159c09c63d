"""The C quantizer (codegen/c/quantizer.py) gives quant_formats' integers and scales bit for
bit: float32 and bf16 weights, transposed and row-major, all-zero groups, exact ties; float8
bytes as torch's conversion rounds them, subnormals and ties included."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.c.quantizer import quantize_fp8_in_c, quantize_in_c
from eqsat_llm.errors import GraphError
from eqsat_llm.formats.quant_formats import format_group, quantize, quantize_in_torch

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")


def weight(k: int, n: int, dtype: torch.dtype, transposed: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(k * 7 + n)
    w = torch.randn((n, k) if transposed else (k, n), generator=g) * 0.05
    w[:, 3 if transposed else 0] = 0  # an all-zero row group / column: scale 1
    w = w.t() if transposed else w
    # exact ties after scaling: multiples of half a step of the column's scale
    w[:8, 1] = torch.tensor([7.0, 3.5, -2.5, 0.5, -0.5, 1.5, -7.0, 6.5]) / 7
    return w.to(dtype)


@pytest.mark.parametrize("fmt", ["int8", "int4_g32", "int4_g128"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("k,n", [(256, 40), (640, 130)])  # one tile of rows and several;
def test_the_c_quantizer_equals_torch_bit_for_bit(fmt, dtype, transposed, k, n):  # a part block
    w = weight(k, n, dtype, transposed)
    got = quantize_in_c(w, format_group(fmt))
    assert got is not None
    want = quantize_in_torch(w, fmt)
    for g, x in zip(got, want):
        assert g.dtype == x.dtype and g.shape == x.shape and g.is_contiguous()
        assert torch.equal(g, x)
    assert all(torch.equal(a, b) for a, b in zip(quantize.__wrapped__(w, fmt), want))


def test_other_kinds_are_left_to_torch():
    assert quantize_in_c(torch.randn(64, 8, dtype=torch.float64), 32) is None
    assert quantize_in_c(torch.randn(64, 8, dtype=torch.float16), 0) is None


def test_a_nan_in_a_group_gives_torchs_scale():
    w = torch.randn(64, 8)
    w[5, 2] = float("nan")
    for fmt in ("int8", "int4_g32"):
        got, want = quantize_in_c(w, format_group(fmt)), quantize_in_torch(w, fmt)
        assert torch.equal(got[1], want[1])  # scale 1 where the group holds a NaN
        assert float(got[1].reshape(-1, 8)[0, 2]) == 1.0


def test_int4_scales_round_to_float16_as_torch_does():
    # scales across float16's range: subnormal ones, ties of the 10-bit mantissa, the top
    # of the range; each group's scale is the float16 nearest max |w| / 7
    amax = torch.tensor([3e-7, 7 * 2.0 ** -14 * 1.00048828125, 7 * 1.0009765625 * 0.5,
                         7 * (1 + 3 * 2.0 ** -11), 7 * 65504.0, 1e-30, 0.7, 7 * 6.1e-5])
    w = torch.zeros(32 * len(amax), 3)
    for g, a in enumerate(amax):
        w[32 * g, :] = a
        w[32 * g + 1:32 * g + 32, :] = torch.linspace(-1, 1, 31)[:, None] * a
    got, want = quantize_in_c(w, 32), quantize_in_torch(w, "int4_g32")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(want[1], want[1].half().float())  # stored as float16 exactly
    nearest = (amax / 7).half().float()
    assert torch.equal(want[1][:, 0], torch.where(nearest > 0, nearest, torch.ones(1)))


def test_an_int4_scale_past_float16_is_refused():
    w = torch.randn(64, 4)
    w[3, 1] = 7 * 70000.0
    with pytest.raises(GraphError, match="float16"):
        quantize(w, "int4_g32")
    quantize(w, "int8")  # int8's float32 scales hold it


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [True, False])
def test_the_c_float8_quantizer_equals_torch_bit_for_bit(fmt, dtype, transposed):
    w = weight(640, 130, dtype, transposed).float()
    w[:, 5] *= 1e-6  # a column whose small values are float8 subnormals after scaling
    top = 448.0 if fmt == "fp8_e4m3" else 57344.0
    # every float8 value and every midpoint between two (ties: to even) in one column
    dt = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2
    values = torch.arange(256, dtype=torch.uint8).view(dt).float()
    values = values[values.isfinite()].sort().values
    grid = torch.cat([values, (values[1:] + values[:-1]) / 2])[:640]
    w[:, 7] = 0.0
    w[:len(grid), 7] = grid  # its max is `top`: scale 1, so w / scale is each value exactly
    assert float(grid.abs().max()) == top
    w = w.to(dtype)
    got = quantize_fp8_in_c(w, fmt)
    want = quantize_in_torch(w, fmt)
    assert got is not None
    for g, x in zip(got, want):
        assert g.dtype == x.dtype and g.shape == x.shape and g.is_contiguous()
        assert torch.equal(g, x), (g != x).nonzero()[:5]
    bad = w.float().clone()
    bad[3, 2] = float("inf")
    with pytest.raises(GraphError, match="NaN or inf"):
        quantize_fp8_in_c(bad, fmt)
