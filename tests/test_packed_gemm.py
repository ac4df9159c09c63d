"""The packed-weight GEMM of the C backend (codegen/c/packed_gemm.py) against torch eager and
the reference (test_c_backend.check): row counts around the 14-row tile, column counts around
the 32-column panel, the fused epilogue (alpha, bias, residual broadcast along rows or
columns), batched and strided operands, the vector kernel (AVX-512 or AVX2) and the portable
one."""

from __future__ import annotations

import subprocess

import pytest
import torch

from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import CFLAGS, compiler
from eqsat_llm.codegen.c.packed_gemm import PackedWeight
from eqsat_llm.codegen.c.tiles import PACKED_PANEL
from eqsat_llm.ir import Graph
from eqsat_llm.ops import add_gemm

from .conftest import const, inp, rand_inputs
from .test_c_backend import check

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def _has_vector_kernel() -> bool:
    """Whether CFLAGS (-march=native, narrowed by $EQSAT_ISA) build a vector micro-kernel
    (AVX-512, or AVX2 with FMA)."""
    cc = compiler()
    out = subprocess.run([cc, *CFLAGS, "-dM", "-E", "-x", "c", "/dev/null"],
                         capture_output=True, text=True, check=False).stdout
    return "__AVX512F__" in out or ("__AVX2__" in out and "__FMA__" in out)


PORTABLE = [*CFLAGS, "-mno-avx512f", "-mno-avx2"]
FLAGS = [pytest.param(None, id="native"), pytest.param(PORTABLE, id="portable")]


def _packed_calls(rt: CRuntime) -> int:
    return rt.source.count("eq_gemm_packed(") - 1  # minus the definition


def test_pack_layout_is_column_panels():
    w = torch.arange(3 * 70, dtype=torch.float32).reshape(3, 70)
    spec = PackedWeight("w", 0, 3, 70, 70, 1)
    p = spec.prepare({"w": w})
    assert p.shape == (3, 3, PACKED_PANEL)  # ceil(70 / 32) panels of K x 32
    assert torch.equal(p[1, 2], w[2, 32:64])
    assert torch.equal(p[2, 0, :6], w[0, 64:]) and not p[2, :, 6:].any()  # zero padding
    # a transposed view
    t = PackedWeight("w", 0, 70, 3, 1, 70).prepare({"w": w})
    assert torch.equal(t[0, :, :3], w.t())


@pytest.mark.parametrize("flags", FLAGS)
def test_shapes_around_the_tile(flags):
    if flags is None and not _has_vector_kernel():
        pytest.skip("no AVX-512 or AVX2 here: the native build is the portable one")
    rows, cols, k = [1, 2, 13, 14, 15, 29, 130], [1, 16, 17, 32, 33, 100], 23
    g = Graph()  # one program, one GEMM per (rows, cols)
    xs = {m: inp(g, (m, k)) for m in rows}
    ws = {n: const(g, torch.randn(k, n)) for n in cols}
    g.outputs = [g.add("matmul", (xs[m], ws[n]), alpha=1.0) for m in rows for n in cols]
    rt = check(g, rand_inputs(g), flags=flags, use_blas=False)
    assert _packed_calls(rt) == len(rows) * len(cols)


@pytest.mark.parametrize("flags", FLAGS)
def test_epilogues_batches_and_views(flags):
    m, k, n = 17, 40, 45
    g = Graph()
    x = inp(g, (2, m, k))
    r_full, r_row = inp(g, (2, m, n)), inp(g, (m, 1))
    w = const(g, torch.randn(k, n))
    wt = const(g, torch.randn(n, k))  # linear's weight: read through a transposed view
    b = const(g, torch.randn(n))
    x2 = g.add("view", (x,), shape=[2 * m, k])
    g.outputs = [
        g.add("matmul", (x, w), alpha=0.5),
        add_gemm(g, x, w, addend=r_full, epilogue="add"),
        add_gemm(g, x, w, addend=r_row, alpha=2.0, epilogue="add"),
        g.add("linear_bias", (x, wt, b)),
        g.add("addmm", (b, x2, w), beta=0.5, alpha=1.5),
        g.add("linear", (g.add("permute", (x,), dims=[1, 0, 2]), wt)),  # rows not evenly spaced
    ]
    rt = check(g, rand_inputs(g), flags=flags, use_blas=False)
    assert _packed_calls(rt) == 6
    # one packed copy per distinct weight view: w, and wt seen transposed
    assert sum(isinstance(s, PackedWeight) for s in rt.program.layout.weights) == 2
    # the bias went into the kernel's epilogue: no separate bias loop
    assert "bb[" not in rt.source


@pytest.mark.parametrize("flags", FLAGS)
def test_a_decode_row_over_many_panels(flags):
    """One row (decode) against 4 to 21 panels: up to four read side by side, then the tail
    (each thread's share of 10 panels is 5, of 13 is 6 and 7), with each epilogue."""
    k = 37
    g = Graph()
    x = inp(g, (1, k))
    outs = []
    for n in (128, 300, 417, 650):
        w = const(g, torch.randn(k, n))
        outs += [g.add("matmul", (x, w), alpha=0.5),
                 add_gemm(g, x, w, addend=inp(g, (1, n)), alpha=2.0, epilogue="add"),
                 g.add("addmm", (const(g, torch.randn(n)), x, w), beta=0.5, alpha=1.5),
                 add_gemm(g, x, w, act="gelu_tanh")]
    g.outputs = outs
    rt = check(g, rand_inputs(g), flags=flags, use_blas=False)
    assert _packed_calls(rt) == len(outs)


def test_a_weight_that_is_an_input_is_not_packed():
    g = Graph()
    x, w = inp(g, (20, 8)), inp(g, (8, 40))
    g.outputs = [g.add("matmul", (x, w), alpha=1.0)]
    rt = check(g, rand_inputs(g), use_blas=False)
    assert _packed_calls(rt) == -1  # not even defined


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("m", [2, 10, 13, 30])
def test_a_is_read_in_tile_order_at_every_row_count(m, flags):
    """The tiles read A copied once per GEMM into tile order (eq_tile_order: each tile's rows
    as columns, tiles of 14 / 8 / 4 / 2 / 1 rows with AVX-512, 6 / 4 / 2 / 1 with AVX2, one
    row portable): row counts that take every tile size (2; 10 = 8 + 2 or 6 + 4; 13 = 8 + 4
    + 1 or 6 + 6 + 1; 30 = 14 + 14 + 2 or 5 x 6), A a slice of a wider buffer (row
    stride 8 KiB, K = 1024: rows 4 KiB apart, which evicted each other from L1 when read in
    place), the SwiGLU GEMM's blocks of rows, against torch; then a second call with other
    values, which rewrites the kept buffer."""
    g = Graph()
    x = inp(g, (m, 2048))
    w1 = const(g, torch.randn(1024, 40))
    left = g.add("slice", (x,), dim=1, start=0, end=1024, step=1)
    wg = torch.randn(2048, 66)
    swiglu = add_gemm(g, x, const(g, wg), epilogue="swiglu")
    g.outputs = [g.add("matmul", (left, w1), alpha=1.0), swiglu]
    rt = CRuntime(g, flags=flags)
    assert "eq_tiled(" in rt.source
    for xs in (rand_inputs(g), [torch.randn(m, 2048)]):
        got = rt.run(xs)
        x0 = xs[0]
        torch.testing.assert_close(got[0], x0[:, :1024] @ g.constants["c0"], atol=1e-3,
                                   rtol=1e-4)
        gate, up = (x0 @ wg).split(33, dim=1)
        # (a product of two sums of 2048 terms, each ~45 in size: its own rounding)
        torch.testing.assert_close(got[1], torch.nn.functional.silu(gate) * up, atol=0.05,
                                   rtol=1e-3)


@pytest.mark.parametrize("m", [1, 7, 30])
def test_k_in_blocks_adds_each_block_to_the_sums(m):
    """eq_panel with K in blocks (AVX2 builds use blocks of EQ_KC = 2048 rows; here 64, on
    any vector ISA, so that K = 200 takes 4 blocks of 50): each block after the first adds to
    the sums, and the epilogue (alpha, a residual, bias and activation, SwiGLU) runs once,
    after the last. (N 200: each thread takes several panels, block by block: a block's
    panels, then the next block's.)"""
    g = Graph()
    x = inp(g, (m, 200))
    residual = inp(g, (m, 200))
    plain = add_gemm(g, x, const(g, torch.randn(200, 200)), alpha=0.5, addend=residual,
                     epilogue="add")
    biased = add_gemm(g, x, const(g, torch.randn(200, 40)), addend=const(g, torch.randn(40)),
                      epilogue="bias", act="silu")
    swiglu = add_gemm(g, x, const(g, torch.randn(200, 66)), epilogue="swiglu")
    g.outputs = [plain, biased, swiglu]
    rt = check(g, rand_inputs(g), tol=1e-4, flags=[*CFLAGS, "-DEQ_KC=64"])
    assert _packed_calls(rt) > 0
