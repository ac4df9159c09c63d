"""Sparse weights, as rewrites: a GEMM on a constant weight W whose values have 2:4 structure
along K, or 16 x 16 blocks of zeros, is the same GEMM on W's stored values and their
positions (formats/sparse_formats.py), which constant folding computes once at compile time. The C
kernels skip the zeros (codegen/c/sparse_gemm.py); the cost model prices the stored bytes and
multiply-adds, so extraction takes the sparse GEMM only where skipping pays.

The structure comes from the analysis (two_four, stored_blocks), which the encoder seeds from
the constants' values when optimize(sparsity="auto") asks: an opt-in family, not in "all".
Exact: the zeros skipped add nothing."""

import torch
from egglog import Vec, eq, i64

from eqsat_llm.egraph.analysis import is_const, is_float_dtype, stored_blocks, two_four
from eqsat_llm.egraph.language import E, Tensor, dtype, shape
from eqsat_llm.formats.sparse_formats import BLOCK
from eqsat_llm.rulebook import exact, family

from .fusion import stored_weight_rules


def pruned(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A drawn weight as `rules check` needs it: 2:4 along one dim (drawn: a rule that reads
    the wrong dim then meets weights without the structure) and about half of its 16 x 16
    blocks zero."""
    if w.dim() != 2 or w.shape[0] % 4 or w.shape[1] % 4:
        return w
    along_k = bool(torch.randint(0, 2, (), generator=gen))
    m = w if along_k else w.t()
    k, n = m.shape
    rank = torch.rand(k // 4, 4, n, generator=gen).argsort(1).argsort(1)
    m = m * (rank < 2).reshape(k, n)
    w = m if along_k else m.t()
    k, n = w.shape
    if k % BLOCK == 0 and n % BLOCK == 0:
        blocks = torch.rand(k // BLOCK, 1, n // BLOCK, 1, generator=gen) < 0.5
        w = w * blocks.expand(-1, BLOCK, -1, BLOCK).reshape(k, n)
    return w


@family("sparsity")
def sparsity(x: Tensor, w: Tensor, sw: Vec[i64], b: i64):
    # W: a constant float matrix [K, N] (x @ W) whose values have the format's structure
    weight = [is_const(w), eq(sw).to(shape(w)), eq(sw.length()).to(i64(2)),
              is_float_dtype(dtype(w))]
    structures = {"sparse24": ([two_four(w, i64(0))], i64(0)),
                  "bsr16": ([eq(b).to(stored_blocks(w))], b)}
    for fmt, (has, blocks) in structures.items():
        vals, index = E.sparse_values(w, fmt, blocks), E.sparse_index(w, fmt, blocks)
        note = f"W stored as {fmt}: its zeros skipped"
        check = {"check_dims": (16, 32), "check_weights": pruned}
        matmul, gemm = stored_weight_rules(fmt, vals, index, [*weight, *has], x, w, sw)
        yield exact(f"{fmt}-matmul", matmul, note, **check)
        yield exact(f"{fmt}-gemm", gemm, note, **check)
