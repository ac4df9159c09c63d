"""Epilogue fusion: the gemm with the add epilogue, alpha * (x @ w) + r, one
kernel. Its reference against the C backend (BLAS and generated GEMMs) and the planned runtime
on odd shapes, its shape rule, and the rules that recognise it on the LLaMA-style block."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.codegen import PlannedRuntime, ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.blas import openblas_dir
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.egraph.analysis import analysis
from eqsat_llm.egraph.encode import encode
from eqsat_llm.egraph.language import shape
from eqsat_llm.extraction.costmodel import CostModel
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.workloads import llama_block_case
from eqsat_llm.ops import GEMM_DEFAULTS as GEMM_ATTRS
from eqsat_llm.ops import add_gemm, evaluate

from .conftest import const, inp, max_error, rand_inputs
from .eager_oracle import run_eager

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
BLAS = [False] + ([True] if openblas_dir() else [])
K, N = 19, 37  # N not a multiple of 16


def _graph(x_shape, r_shape, alpha=1.0, then_neg=False, w_transposed=False, w_input=False):
    """gemm[add](x, w, r) with a constant weight (optionally a transposed view of one), or
    with w an input (not packed: BLAS or the generated GEMM)."""
    g = Graph()
    x, r = inp(g, x_shape), inp(g, r_shape)
    gen = torch.Generator().manual_seed(1)
    wt = torch.randn((N, K) if w_transposed else (K, N), generator=gen)
    if w_input:
        w = inp(g, tuple(wt.shape))
    else:
        w = const(g, wt)
    if w_transposed:
        w = g.add("transpose", (w,), dim0=0, dim1=1)
    y = add_gemm(g, x, w, addend=r, alpha=alpha, epilogue="add")
    g.outputs = [g.add("neg", (y,)) if then_neg else y]
    return g


SHAPES = [  # (x, r): M = 1, 5, 33; r broadcast [N], per-row [M, 1] and full-shape
    ((1, K), (N,)), ((5, K), (5, N)), ((33, K), (N,)), ((33, K), (33, N)),
    ((1, 1, K), (1, 1, N)), ((2, 5, K), (N,)), ((1, 33, K), (1, 33, N)),
    ((2, 33, K), (2, 33, N)), ((3, 5, K), (5, 1)), ((2, 33, K), (33, N)),
]


def test_reference_is_the_pair_it_replaces():
    x, w, r = torch.randn(5, K), torch.randn(K, N), torch.randn(N)
    for alpha, want in ((1.0, x @ w + r), (0.5, (x @ w) * 0.5 + r)):
        attrs = {**GEMM_ATTRS, "n": N, "alpha": alpha, "epilogue": "add"}
        assert torch.equal(evaluate("gemm", [x, w, 0.0, 0.0, r], attrs), want)


@needs_cc
@pytest.mark.parametrize("blas", BLAS)
@pytest.mark.parametrize("x_shape,r_shape", SHAPES)
def test_c_backend_matches_reference(blas, x_shape, r_shape):
    for alpha, then_neg, wt, w_input in ((1.0, False, False, False), (0.5, True, True, False),
                                         (1.0, False, False, True)):
        g = _graph(x_shape, r_shape, alpha, then_neg, wt, w_input)
        inputs = rand_inputs(g)
        want = ReferenceRuntime(g).run(inputs)[0]
        rt = CRuntime(g, use_blas=blas)
        assert rt.uses_blas == blas
        got = rt.run(inputs)[0]
        assert got.shape == want.shape
        assert max_error(want, got) <= 1e-5, (x_shape, r_shape, alpha)
        assert max_error(run_eager(g, inputs)[0], got) <= 1e-5, "torch eager"
        # the planned (torch) runtime runs the reference's own steps: bit-identical
        assert torch.equal(PlannedRuntime(g, check=True).run(inputs)[0], want)


@needs_cc
@pytest.mark.skipif(not openblas_dir(), reason="scipy-openblas32 not installed")
def test_blas_path_fuses_the_epilogue_into_the_gemm_kernel():
    g = _graph((33, K), (N,), w_input=True)  # a weight that is not a constant: not packed
    src = CRuntime(g, use_blas=True).program.source
    kernel = src[src.index("_gemm_add("):]
    assert "EQ_SGEMM" in kernel and "orow[n] += rrow" in kernel
    assert sum(k.op == "gemm[add]" for k in CRuntime(g, use_blas=True).program.kernels) == 1


@needs_cc
def test_packed_path_fuses_the_epilogue_into_the_gemm_kernel():
    g = _graph((33, K), (N,))  # a constant weight: packed, r added to each tile as it is stored
    rt = CRuntime(g)
    kernel = rt.source[rt.source.index("_gemm_add("):]
    kernel = kernel[:kernel.index("\n}\n")]
    assert "eq_gemm_packed(" in kernel and "EQ_SGEMM" not in kernel
    assert "const eq_addend e[] = {{rr + 0, 0, 1, 1.0f}}" in kernel, kernel
    assert sum(k.op == "gemm[add]" for k in rt.program.kernels) == 1


def test_shape_rule_and_cost():
    g = Graph()
    x, r = inp(g, (2, 5, K)), inp(g, (N,))
    g.constants["w"] = torch.randn(K, N)
    w = g.append("const", (), {"name": "w"}, TensorType((K, N), "float32"))
    y = add_gemm(g, x, w, addend=r, epilogue="add")
    g.outputs = [y]
    assert g.type_of(y).shape == (2, 5, N)
    enc = encode(g)
    enc.egraph.run(analysis.saturate())
    got = enc.egraph.extract(shape(enc.exprs[y]))
    assert tuple(int(d) for d in got.value) == (2, 5, N)
    # one kernel that never writes the product out and reads it back: cheaper than the pair
    cm = CostModel()
    f32 = lambda *s: TensorType(s, "float32")
    xs, ws, out = f32(128, 512), f32(512, 512), f32(128, 512)
    py = TensorType((), "py_float")
    fused = cm.micros("gemm", {**GEMM_ATTRS, "n": 512, "epilogue": "add"},
                      [xs, ws, py, py, out], out)
    pair = (cm.micros("matmul", {"alpha": 1.0}, [xs, ws], out)
            + cm.micros("add", {}, [out, out], out))
    assert cm.micros("matmul", {"alpha": 1.0}, [xs, ws], out) < fused < pair


@pytest.mark.parametrize("case", ["prefill", "decode"])
@pytest.mark.parametrize("backend", ["c", "reference"])
def test_residual_adds_fuse_on_the_llama_block(case, backend):
    if backend == "c" and compiler() is None:
        pytest.skip("no C compiler")
    model, inputs = llama_block_case(case)
    compiled = optimize(model, inputs, backend=backend)
    assert compiled.report.backend == backend  # no fallback
    ops = compiled.graph.op_counts()
    # the residual adds after o_proj and down_proj are epilogues; the rotary adds are inside
    # rope (tests/test_rope.py), so no add remains
    assert ops["gemm[add]"] == 2 and ops["add"] == 0, ops
    fired = {r.name for r in compiled.report.rules if r.matches}
    assert fired & {"matmul-add", "add-matmul"}, fired
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) <= 1e-5
        fresh = tuple(torch.randn_like(x) for x in inputs)
        assert max_error(model(*fresh), compiled(*fresh)) <= 1e-5
