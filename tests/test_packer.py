"""The C packer (codegen/c/packer.py) against PackedWeight's torch form, bit for bit: row-major
and transposed views (a widened nn.Linear weight), offsets into a merged weight, a part
panel, float32 and bf16 constants, non-contiguous constants, a column stride that wraps rows."""

import pytest
import torch

from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.c.packed_gemm import PackedWeight
from eqsat_llm.codegen.c.packer import pack_columns_in_c, pack_in_c
from eqsat_llm.codegen.c.tiles import PACKED_PANEL

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def _constant(shape, dtype, transposed):
    t = torch.randn(shape[::-1] if transposed else shape, generator=torch.Generator()
                    .manual_seed(sum(shape))).to(dtype)
    t[0, 0] = float("nan")  # bits carried as they are
    return t.T if transposed else t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [
    # (constant shape, transposed storage, view: offset, k, n, rs, cs)
    ((96, 70), False, (0, 96, 70, 70, 1)),          # the whole weight, row-major
    ((96, 70), True, (0, 96, 70, 70, 1)),           # stored transposed (x @ linear.weight.T)
    ((70, 96), False, (0, 96, 70, 1, 96)),          # a transposed view of a row-major one
    ((64, 200), False, (64, 64, 96, 200, 1)),       # k's columns of a merged qkv weight
    ((200, 64), True, (64 * 64, 64, 40, 1, 64)),    # a transposed part, a part panel
    ((8, 30), False, (3, 5, 7, 37, 2)),             # strides that wrap rows
])
def test_panels_equal_torchs_form(dtype, case):
    shape, transposed, (offset, k, n, rs, cs) = case
    w = _constant(shape, dtype, transposed)
    pw = PackedWeight("w", offset, k, n, rs, cs)
    got = pack_in_c(w, offset, k, n, rs, cs)
    want = pw.prepare_in_torch(w)
    assert got is not None and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(pw.prepare({"w": w}).view(torch.int32), want.view(torch.int32))


def test_what_it_does_not_take_falls_back_to_torch():
    assert pack_in_c(torch.randn(4, 4, 4), 0, 4, 4, 4, 1) is None  # 3-D
    assert pack_in_c(torch.randn(4, 4).half(), 0, 4, 4, 4, 1) is None  # float16
    assert pack_in_c(torch.randn(4, 4), 0, 4, 5, 4, 1) is None  # past the end
    w = torch.randn(PACKED_PANEL + 1, 8)  # parts stored [width, K]
    assert pack_columns_in_c([(1, w)], 8, PACKED_PANEL + 2) is None  # starts inside a panel
    # a ragged part before another shares a panel with it
    assert pack_columns_in_c([(0, w), (PACKED_PANEL + 1, w)], 8, 2 * PACKED_PANEL + 2) is None
