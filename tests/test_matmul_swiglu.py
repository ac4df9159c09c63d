"""The gemm's SwiGLU epilogue, swiglu(x @ wg, x @ wu) with [wg | wu] its weight: its
reference is the three ops it replaces; the C kernel (packed, both products joined on the tile
as it is stored; or row streaming when a weight is not a constant) against it on odd shapes;
the planned runtime. (The rule matmul-swiglu is checked with the library's rules in
test_rulecheck.py; the gemm[swiglu] it makes on the LLaMA block and LLaMA is counted in
test_norm_matmul.py.)"""

from __future__ import annotations

import pytest
import torch

from eqsat_llm.codegen import PlannedRuntime, ReferenceRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.ir import Graph
from eqsat_llm.ops import GEMM_DEFAULTS, add_gemm, evaluate

from .conftest import const, inp, rand_inputs
from .test_c_backend import check

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def test_reference_is_the_ops_it_replaces():
    x, wg, wu = torch.randn(5, 7), torch.randn(7, 9), torch.randn(7, 9)
    g, u = x @ wg, x @ wu
    want = evaluate("swiglu", [g, u], {})
    attrs = {**GEMM_DEFAULTS, "n": 9, "epilogue": "swiglu"}
    got = evaluate("gemm", [x, torch.cat([wg, wu], 1), 0.0, 0.0, 0.0], attrs)
    assert torch.equal(got, want)
    torch.testing.assert_close(got, torch.nn.functional.silu(g) * u)  # torch's meaning


def _graph(m: int, k: int, n: int, constant: bool, batch: tuple[int, ...] = (1,)) -> Graph:
    g = Graph()
    x = inp(g, (*batch, m, k))
    if constant:  # a strided view of a constant
        w = g.add("transpose", (const(g, torch.randn(2 * n, k)),), dim0=0, dim1=1)
    else:
        w = inp(g, (k, 2 * n))
    g.outputs = [add_gemm(g, x, w, epilogue="swiglu")]
    return g


@needs_cc
@pytest.mark.parametrize("constant", [True, False])
def test_c_kernel_against_the_reference(constant):
    # (decode rows over 7 and 10 panels: two gate and two up panels side by side, a tail of one)
    for m, k, n, batch in [(1, 9, 37, (1,)), (1, 21, 200, (1,)), (1, 12, 300, (1,)),
                           (5, 19, 70, (1,)), (33, 16, 300, (2,)), (130, 8, 33, (1,))]:
        g = _graph(m, k, n, constant, batch)
        rt = check(g, rand_inputs(g), use_blas=False)
        assert ("eq_gemm_packed_swiglu(" in rt.source.split("/* kernel ")[-1]) == constant
        assert len(rt.program.kernels) == 1


def test_planned_runtime_is_bit_identical():
    g = _graph(6, 8, 40, True)
    xs = rand_inputs(g)
    assert torch.equal(PlannedRuntime(g).run(xs)[0], ReferenceRuntime(g).run(xs)[0])
