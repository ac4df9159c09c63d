"""QuantPanels' 16-bit panels laid out in C (codegen/c/panel_layout.py) equal torch's strided
copy of the same values: transposed and row-major sources, part panels, a SwiGLU weight's
halves, rows that are not a multiple of the tile."""

import pytest
import torch

from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.c.panel_layout import half_panels_into
from eqsat_llm.codegen.c.quant_gemm import QuantPanels

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")


def torch_panels(half: torch.Tensor) -> torch.Tensor:
    rows, n = half.shape
    padded = torch.zeros(rows, -(-n // 64) * 64, dtype=half.dtype)
    padded[:, :n] = half
    return padded.reshape(rows, -1, 64).permute(1, 0, 2).contiguous()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,n", [(64, 64), (100, 130), (7, 5), (256, 200)])
@pytest.mark.parametrize("transposed", [True, False])
def test_the_c_panels_equal_torchs(dtype, rows, n, transposed):
    w = torch.randn((n, rows) if transposed else (rows, n)).to(dtype)
    half = w.t() if transposed else w
    out = torch.full((-(-n // 64), rows, 64), float("nan"), dtype=dtype)  # (no stale pad)
    assert half_panels_into(out, half)
    assert torch.equal(out.view(torch.int16), torch_panels(half).view(torch.int16))


def test_quant_panels_of_a_transposed_swiglu_weight():
    gate_up = torch.randn(2 * 100, 96).to(torch.bfloat16)  # nn.Linear [2N, K]
    w = gate_up.t()  # the GEMM's [K, 2N], read where it lies
    got = QuantPanels("w", 0, 96, 100, 200, halves=2).prepare({"w": w})
    want = torch.cat([torch_panels(w[:, :100]), torch_panels(w[:, 100:])])
    assert torch.equal(got, want.view(torch.int16))
    # a part of the columns, and a view that is not whole rows (the flattened form)
    part = QuantPanels("w", 100, 96, 70, 200).prepare({"w": w})
    assert torch.equal(part, torch_panels(w[:, 100:170]).view(torch.int16))
    odd = QuantPanels("w", 3, 5, 64, 70).prepare({"w": w})
    flat = w.reshape(-1).as_strided((5, 64), (70, 1), 3)
    assert torch.equal(odd, torch_panels(flat).view(torch.int16))


def test_other_kinds_are_left_to_torch():
    out = torch.empty(1, 4, 64)
    assert not half_panels_into(out, torch.randn(4, 10))  # 32-bit values
    assert not half_panels_into(torch.empty(2, 4, 64, dtype=torch.bfloat16),
                                torch.randn(4, 10).bfloat16())  # the wrong panel count
