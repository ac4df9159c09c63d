"""The GEMM geometry the C emitters share (codegen/c/gemm_geometry.py): batches folded into
rows where the rows are evenly spaced and B is shared, the batch loop's dims and offsets
otherwise, a single row's strides, broadcast addends, and what is no product."""

from __future__ import annotations

from eqsat_llm.codegen.c.gemm_geometry import Strides, gemm_geometry
from eqsat_llm.codegen.c.values import Ref
from eqsat_llm.ir import contiguous_strides


def ref(shape: tuple[int, ...], strides: tuple[int, ...] | None = None, slot: int = 0) -> Ref:
    return Ref("IN", slot, 0, shape, strides or contiguous_strides(shape), "float32")


def test_evenly_spaced_batches_fold_into_rows():
    out, x, w = ref((2, 3, 8)), ref((2, 3, 5), slot=1), ref((5, 8), slot=2)
    geo = gemm_geometry(out, x, w)
    assert (geo.m, geo.k, geo.n, geo.batch, geo.batches, geo.macs) == (6, 5, 8, (), 1, 240)
    assert geo.a == Strides((), 5, 1) and geo.b == Strides((), 8, 1)
    assert geo.c == Strides((), 8, 1) and geo.r is None
    assert geo.rows_evenly_spaced and geo.unit_columns and geo.b_shared
    assert (geo.lda, geo.ldc) == (5, 8) and geo.batch_offset(geo.a) == "0"


def test_a_batched_b_keeps_the_batch_loop():
    out, x, w = ref((2, 3, 8)), ref((2, 3, 5), slot=1), ref((2, 5, 8), slot=2)
    geo = gemm_geometry(out, x, w)
    assert (geo.m, geo.batch, geo.batches) == (3, (2,), 2) and not geo.b_shared
    assert geo.a == Strides((15,), 5, 1) and geo.b == Strides((40,), 8, 1)
    assert geo.batch_offset(geo.b) == "((bi / 1) % 2) * 40"
    assert geo.row_shape == (2, 3) and geo.row_strides(geo.c) == (24, 8)


def test_rows_not_evenly_spaced_keep_the_batch_loop():
    # x [2, 3, 5] a permuted view of [3, 2, 5]: its batches interleave
    out, x = ref((2, 3, 8)), ref((2, 3, 5), (5, 10, 1), slot=1)
    geo = gemm_geometry(out, x, ref((5, 8), slot=2))
    assert not geo.rows_evenly_spaced and geo.batch == (2,) and geo.m == 3
    assert geo.a == Strides((5,), 10, 1) and geo.b_shared
    # a broadcast B and leading dims of size 1 merge away
    out4, x4 = ref((2, 1, 3, 8)), ref((2, 1, 3, 5), slot=1)
    geo = gemm_geometry(out4, x4, ref((1, 5, 8), slot=2))
    assert geo.rows_evenly_spaced and geo.m == 6


def test_a_single_row_keeps_its_strides_but_the_kernels_leading_dims_are_its_lengths():
    out, x = ref((1, 8), (16, 1)), ref((1, 5), (7, 1), slot=1)
    geo = gemm_geometry(out, x, ref((5, 8), slot=2))
    assert geo.m == 1 and geo.a.rows == 7 and geo.c.rows == 16
    assert (geo.lda, geo.ldc) == (5, 8)
    one = gemm_geometry(ref((8,)), ref((5,), slot=1))  # a 1-D x: one row, no B
    assert (one.m, one.lda, one.ldc, one.b, one.batch) == (1, 5, 8, None, ())


def test_an_addend_is_broadcast_to_c_and_walked_with_its_rows():
    out, x, w = ref((2, 3, 8)), ref((2, 3, 5), slot=1), ref((5, 8), slot=2)
    assert gemm_geometry(out, x, w, ref((8,), slot=3)).r == Strides((), 0, 1)
    assert gemm_geometry(out, x, w, ref((3, 1), slot=3)).r.cols == 0
    per_batch = gemm_geometry(out, x, w, ref((3, 8), slot=3))  # repeats across batches
    assert per_batch.batch == (2,) and per_batch.r == Strides((0,), 8, 1)
    assert per_batch.batch_offset(per_batch.r) == "0"


def test_what_is_no_product():
    x, w = ref((3, 5), slot=1), ref((5, 8), slot=2)
    assert gemm_geometry(ref(()), x, w) is None
    assert gemm_geometry(ref((3, 8)), ref((), slot=1), w) is None
    assert gemm_geometry(ref((3, 8)), x, ref((5,), slot=2)) is None
    assert gemm_geometry(ref((3, 8)), x, w, ref((1, 3, 8), slot=3)) is None
