"""The geometry of one GEMM as the C emitters see it, built once from its operands' views
(values.Ref) by `gemm_geometry`:

    C [batch..., m, n] = A [batch..., m, k] @ B [batch..., k, n]  (+ R broadcast to C)

Each operand is a strided view; the geometry holds the sizes and, per operand, its strides
(`Strides`). Batches whose rows lie evenly spaced in A, C and R, against one shared B, are
folded into the rows (one GEMM of m rows, `batch` empty); the batch dims that remain (none
when folded) are merged where every operand allows. A 1-D operand is one row. B is None for a
weight stored in a format (quantized, sparse, half: its layout is the format's); R is None
without an addend that the kernel walks row by row with C."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .loops import broadcast_strides, collapse
from .values import Layout, Ref


@dataclass(frozen=True)
class Strides:
    """One operand's strides, in elements: per remaining batch dim (0 where it is broadcast),
    between rows, between columns."""
    batch: tuple[int, ...]
    rows: int
    cols: int


@dataclass(frozen=True)
class GemmGeometry:
    """C = A @ B (+ R) as the module docstring draws it: the sizes, the batch dims left, and
    each operand's strides (b None: a weight in a format; r None: no addend walked)."""
    m: int  # rows of C per batch (all of them when the batches are folded)
    k: int
    n: int
    batch: tuple[int, ...]  # the batch dims that remain, merged; () when folded or none
    a: Strides
    b: Strides | None
    c: Strides
    r: Strides | None

    @property
    def batches(self) -> int:
        return math.prod(self.batch)

    @property
    def macs(self) -> int:
        """Multiply-adds of the whole product (the work that decides on threads)."""
        return self.m * self.n * self.k * self.batches

    @property
    def rows_evenly_spaced(self) -> bool:
        """Whether the product is one GEMM over evenly spaced rows (no batch loop): what the
        packed and format kernels take."""
        return not self.batch

    @property
    def unit_columns(self) -> bool:
        """Whether A's and C's columns are contiguous (as the packed and format kernels read
        and write them)."""
        return self.a.cols == 1 and self.c.cols == 1

    @property
    def b_shared(self) -> bool:
        """Whether one B serves every batch (a packable weight)."""
        return self.b is not None and not any(self.b.batch)

    @property
    def lda(self) -> int:
        """A's row stride as the packed and format kernels take it (k for a single row, whose
        stride nothing reads)."""
        return self.a.rows if self.m > 1 else self.k

    @property
    def ldc(self) -> int:
        """C's row stride as the packed and format kernels take it (n for a single row)."""
        return self.c.rows if self.m > 1 else self.n

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The rows of C as a loop nest walks them: the remaining batch dims, then m."""
        return (*self.batch, self.m)

    def row_strides(self, s: Strides) -> tuple[int, ...]:
        """An operand's strides along `row_shape`."""
        return (*s.batch, s.rows)

    def batch_offset(self, s: Strides) -> str:
        """The C expression of an operand's offset in batch `bi` of the batch loop ("0"
        without one, or where the operand is broadcast)."""
        terms, div = [], 1
        for size, stride in reversed(list(zip(self.batch, s.batch))):
            if stride:
                terms.append(f"((bi / {div}) % {size}) * {stride}")
            div *= size
        return " + ".join(terms) or "0"

    def packed_b(self, w: Ref, layout: Layout) -> Ref | None:
        """The W slot of B (a view of the constant `w` views) packed for the packed GEMM;
        None when w is not a view of a constant."""
        assert self.b is not None
        return layout.packed_weight(w, self.k, self.n, self.b.rows, self.b.cols)


def _strides(t: Ref, shape: tuple[int, ...]) -> Strides:
    """t's strides broadcast to `shape`, [batch..., rows, cols]."""
    st = broadcast_strides(shape, t.shape, t.strides)
    return Strides(st[:-2], st[-2], st[-1])


def gemm_geometry(out: Ref, a: Ref, b: Ref | None = None, r: Ref | None = None
                  ) -> GemmGeometry | None:
    """The geometry of out = a @ b (+ r): b None for a weight stored in a format, r the
    addend walked with C's rows (None: none). None when the operands are no such product
    (a scalar, an operand of more dims than out, a B of fewer than 2)."""
    if not out.shape or not a.shape or (b is not None and len(b.shape) < 2) or any(
            len(t.shape) > len(out.shape) for t in (a, b, r) if t is not None):
        return None
    n, k = out.shape[-1], a.shape[-1]
    m = out.shape[-2] if len(out.shape) > 1 else 1
    batch = out.shape[:-2]
    none = Strides((0,) * len(batch), 0, 0)
    every = [_strides(out, (*batch, m, n)), _strides(a, (*batch, m, k)),
             _strides(b, (*batch, k, n)) if b is not None else none,
             _strides(r, (*batch, m, n)) if r is not None else none]
    # one GEMM over all rows where the rows of C, A and R are evenly spaced and B is shared
    # (B's rows are its k: not walked with C's)
    sh, st = collapse((*batch, m), [(*s.batch, 0 if i == 2 else s.rows)
                                    for i, s in enumerate(every)])
    if len(sh) == 1 and st[2][0] == 0:
        m, left = sh[0], ()
        every = [Strides((), s.rows if i == 2 else rs[0], s.cols)
                 for i, (s, rs) in enumerate(zip(every, st))]
    else:
        merged, bst = collapse(batch, [s.batch for s in every])
        left = tuple(merged)
        every = [Strides(tuple(bs), s.rows, s.cols) for s, bs in zip(every, bst)]
    sc, sa, sb, sr = every
    return GemmGeometry(m, k, n, left, sa, sb if b is not None else None, sc,
                        sr if r is not None else None)
