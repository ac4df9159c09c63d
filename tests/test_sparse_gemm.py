"""Sparse-weight GEMMs (codegen/c/sparse_gemm.py): the C kernel eq_gemm_sparse against torch
on the stored arrays as the test unpacks them (tests/eager_oracle.py, from the documented
layout; sparse_formats.unpack must give the same): row counts around the GEMV threshold and the
register tiles, column counts around the 64-column block, the 32-column panel and vector
tails, every epilogue, swiglu, strided operands, serial and parallel; bsr16 with empty block
columns and fully dense; sparse24 with groups of fewer than 2 non-zeros. Built native,
portable (no AVX2: the 4-float vectors, AVX's in-lane permute), SSE only (the generic
select), with AVX-512's 16-float tiling through generic vectors, and with sparse24's
expanded panels for every row count."""

from __future__ import annotations

import ctypes

import pytest
import torch

from eqsat_llm.codegen.c.packed_gemm import PACKED_GEMM_C
from eqsat_llm.codegen.c.prelude import PRELUDE
from eqsat_llm.codegen.c.sparse_gemm import SPARSE_GEMM_C
from eqsat_llm.formats import sparse_formats

from .conftest import build_c, c_build_dir, check_gemm_result, gemm_operands
from .eager_oracle import dequantized

WRAPPER = r"""
void sgemm_sparse(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt,
                  const float* values, const void* index, int64_t ldw, float* c, int64_t ldc,
                  float alpha, const float* rowscale, const eq_addend* e, int ne, int act,
                  int swiglu, int parallel) {
    eq_gemm_sparse(M, N, K, a, lda, fmt, values, index, ldw, c, ldc, alpha, rowscale, e, ne,
                   act, swiglu, parallel);
}
"""

BUILDS = {
    "native": [],
    "portable": ["-mno-avx2", "-mno-avx512f"],
    "sse": ["-mno-avx"],
    # AVX-512's tiling (16-float vectors, 14-row bsr16 tiles) and a GEMV threshold of 8,
    # through generic vectors where the CPU lacks it; at -O1 with at most 8 accumulators
    # (EQ_BACC): 16-float generic vectors on AVX2 spill, and -O3 took 30 s to compile
    "vec16": ["-DEQ_SV=16", "-DEQ_SGEMV_M=8", "-DEQ_BACC=8", "-O1", "-Wno-psabi"],
    "panels": ["-DEQ_SGEMV_M=0"],  # every row count through sparse24's expanded panels
}


def build(flags: list[str], d) -> ctypes.CDLL:
    """The kernel and WRAPPER as a shared object in the folder d, compiled with CFLAGS + flags."""
    dll = build_c(PRELUDE + PACKED_GEMM_C + SPARSE_GEMM_C + WRAPPER, flags, d, "s")
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    dll.sgemm_sparse.argtypes = [i64, i64, i64, ptr, i64, i32, ptr, ptr, i64, ptr, i64,
                                 ctypes.c_float, ptr, ptr, i32, i32, i32, i32]
    dll.sgemm_sparse.restype = None
    return dll


@pytest.fixture(scope="module", params=list(BUILDS))
def lib(request, tmp_path_factory):
    dll = build(BUILDS[request.param], c_build_dir(request, tmp_path_factory, "sparse_gemm"))
    dll.full = request.param == "native"  # the other builds run a subset of the shapes
    return dll


def random_sparse(k: int, n: int, fmt: str, gen: torch.Generator, density: float = 0.5,
                  empty_cols: int = 0) -> torch.Tensor:
    """A float weight [K, N] with the format's structure. sparse24: each group of 4 keeps 2,
    1 or 0 non-zeros at random positions; bsr16: each 16 x 16 block non-zero with probability
    `density`, every `empty_cols`-th block column (when > 0) all zero."""
    w = torch.randn(k, n, generator=gen)
    if fmt == "sparse24":
        keep = torch.rand(k // 4, 4, n, generator=gen).argsort(1) < 2  # 2 of 4
        drop = torch.rand(k // 4, 4, n, generator=gen) < 0.15  # some groups with 1 or 0
        return w * (keep & ~drop).reshape(k, n)
    nzb = torch.rand(k // 16, n // 16, generator=gen) < density
    if empty_cols:
        nzb[:, ::empty_cols] = False
    return w * nzb.repeat_interleave(16, 0).repeat_interleave(16, 1)


def run_case(lib, fmt: str, m: int, n: int, k: int, *, alpha: float = 1.0,
             rowscale: bool = False, addends: tuple[str, ...] = (), act: int = 0,
             swiglu: bool = False, lda_pad: int = 0, ldw_pad: int = 0, parallel: int = 1,
             density: float = 0.5, empty_cols: int = 0, seed: int = 0) -> None:
    """eq_gemm_sparse on random operands against torch in float64, to fp32 accumulation's
    error (1e-4 of the sum of the products' magnitudes, per element)."""
    gen = torch.Generator().manual_seed(seed)
    width = (2 if swiglu else 1) * n
    if fmt == "sparse24":
        ldw = width + ldw_pad  # the stored arrays wider than the weight: a view's row stride
        w_full = random_sparse(k, ldw, fmt, gen)
        values, index = sparse_formats.pack(w_full, fmt)
        w = dequantized(fmt, values, index, k, ldw)[:, :width].double()  # (the test's unpacking)
        assert torch.equal(sparse_formats.unpack(values, index, fmt, k, ldw), w_full)
        assert torch.equal(w, w_full[:, :width].double())
    else:
        ldw = 0
        w_full = random_sparse(k, width, fmt, gen, density, empty_cols)
        if not bool((w_full != 0).any()):
            w_full[0, 0] = 1.0  # pack needs a block (an all-empty weight is not a format case)
        values, index = sparse_formats.pack(w_full, fmt)
        w = dequantized(fmt, values, index, k, width).double()
        assert torch.equal(w, w_full.double())
    ops = gemm_operands(m, n, k, gen, lda_pad=lda_pad, rowscale=rowscale, addends=addends)
    lib.sgemm_sparse(m, n, k, ops.a_full.data_ptr(), ops.lda, 24 if fmt == "sparse24" else 16,
                     values.data_ptr(), index.data_ptr(), ldw, ops.c.data_ptr(), ops.ldc, alpha,
                     ops.rowscale.data_ptr() if rowscale else None, ops.addends, ops.count, act,
                     int(swiglu), parallel)
    check_gemm_result(lib, ops, w, n, alpha, act, swiglu, (fmt, m, n, k))


ROWS = [1, 2, 3, 5, 7, 8, 9, 14, 15, 24, 33, 128]
ROWS_SUBSET = [1, 2, 7, 9, 15, 33]
COLS24 = [1, 7, 17, 33, 64, 100, 136]
COLS16 = [16, 48, 64, 112]
FMTS = ["sparse24", "bsr16"]


@pytest.mark.parametrize("fmt", FMTS)
def test_shapes(lib, fmt):
    cols = COLS24 if fmt == "sparse24" else COLS16
    ks = [64, 96, 128] if fmt == "sparse24" else [64, 128, 96]
    for i, m in enumerate(ROWS if lib.full else ROWS_SUBSET):
        for j, n in enumerate(cols):
            k = ks[(i + j) % len(ks)]
            if fmt == "sparse24" and (i + j) % 4 == 3:
                k += 4  # K not a multiple of the GEMV's chunk
            run_case(lib, fmt, m, n, k, alpha=0.5, rowscale=(i + j) % 2 == 1, seed=i * 10 + j,
                     parallel=(i + j) % 3 != 2)


@pytest.mark.parametrize("fmt", FMTS)
def test_epilogues(lib, fmt):
    k = 64
    cols = [33, 128, 200] if fmt == "sparse24" else [32, 128, 208]
    for m in [1, 3, 8, 9, 33] if lib.full else [1, 9]:
        for n in cols:
            for act in range(5):
                run_case(lib, fmt, m, n, k, alpha=1.5, rowscale=act % 2 == 0,
                         addends=("residual", "bias", "rowvec")[: act % 4], act=act,
                         lda_pad=5, ldw_pad=3 * (act % 2), seed=act)
            run_case(lib, fmt, m, n, k, alpha=0.7, rowscale=True, swiglu=True, lda_pad=5)
            run_case(lib, fmt, m, n, k, swiglu=True, ldw_pad=64, parallel=0)


def test_bsr16_structure(lib):
    # empty block columns, a fully dense weight, a single block, and very sparse
    for m in [1, 4, 6, 7, 20] if lib.full else [1, 7]:
        run_case(lib, "bsr16", m, 96, 64, empty_cols=2, rowscale=True, addends=("bias",),
                 act=1)
        run_case(lib, "bsr16", m, 64, 48, density=1.0)
        run_case(lib, "bsr16", m, 48, 32, density=0.0)  # one block (see run_case)
        run_case(lib, "bsr16", m, 80, 128, density=0.1, swiglu=True, empty_cols=3)


@pytest.mark.parametrize("fmt", FMTS)
def test_large_and_serial(lib, fmt):
    n = 1024 + 64 + 33 if fmt == "sparse24" else 1024 + 48
    for m in [1, 4, 8, 9, 20, 130] if lib.full else [1, 20]:
        run_case(lib, fmt, m, n, 256, rowscale=True, addends=("residual",), act=2)
    run_case(lib, fmt, 6, n, 256, swiglu=True, rowscale=True)
    run_case(lib, fmt, 2, 304, 256, parallel=0)
    run_case(lib, fmt, 30, 304, 256, parallel=0, swiglu=True)
    run_case(lib, fmt, 4, 304, 4096, lda_pad=0)  # rows 16 KiB apart (bsr16: eq_unaliased at
    # M >= 8; the 2:4 panels read A in tile order, eq_tiled)
    run_case(lib, fmt, 12, 304, 1024, lda_pad=0)


def test_pack_round_trip():
    gen = torch.Generator().manual_seed(1)
    for fmt in FMTS:
        w = random_sparse(64, 48, fmt, gen)
        values, index = sparse_formats.pack(w, fmt)
        assert torch.equal(sparse_formats.unpack(values, index, fmt, 64, 48), w)
