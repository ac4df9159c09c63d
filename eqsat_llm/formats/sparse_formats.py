"""Sparse weight formats of the gemm op: what a pruned weight is stored as, as reference
semantics. Exact: a sparse weight stands for the same matrix, its zeros skipped.

A float weight W [K, N] (x @ W, N output channels):

    sparse24   2:4 along K: in every group of 4 rows (4g .. 4g + 3) of a column at most 2
               entries are non-zero. values [K / 2, N] (W's dtype):
               values[2g + j, n] = W[4g + i_j, n] for the group's two kept positions
               i_0 < i_1 (the non-zeros, padded with the lowest unused positions);
               index uint8 [K / 4, N]: index[g, n] = i_0 | i_1 << 2.
    bsr16      16 x 16 blocks, only those with a non-zero entry stored, block column by block
               column (j = 0 .. N/16 - 1), block rows ascending within one. B stored blocks:
               values [B, 16, 16], values[b] = W[16 i : 16 i + 16, 16 j : 16 j + 16];
               index int32 [N / 16 + 1 + B]: index[j] = the first stored block of column j
               (index[N / 16] = B), index[N / 16 + 1 + b] = the block row i of block b.

The structure is read off the constant's values when a model is encoded (egraph/encode.py:
`structure`), and the stored arrays are computed once at compile time by constant folding of
the ops sparse_values and sparse_index (ops/formats.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import GraphError
from ..tensor_type import TensorType
from .last_call import last_call

FORMATS = ("sparse24", "bsr16")
BLOCK = 16


@dataclass(frozen=True)
class Structure:
    """What a 2-D constant's values allow: 2:4 along dim 0 / dim 1, and its non-zero 16 x 16
    blocks (None where its dims are not multiples of 16)."""
    two_four: tuple[bool, bool]
    blocks: int | None
    total_blocks: int | None


def structure(w: torch.Tensor) -> Structure | None:
    """The sparsity structure of a 2-D float tensor; None for other tensors."""
    if w.dim() != 2 or not w.is_floating_point() or w.device.type == "meta" or not w.numel():
        return None
    nz = w.detach() != 0
    k, n = nz.shape
    two_four = (k % 4 == 0 and bool((nz.reshape(k // 4, 4, n).sum(1) <= 2).all()),
                n % 4 == 0 and bool((nz.reshape(k, n // 4, 4).sum(2) <= 2).all()))
    if k % BLOCK or n % BLOCK:
        return Structure(two_four, None, None)
    blocks = nz.reshape(k // BLOCK, BLOCK, n // BLOCK, BLOCK).any(3).any(1)
    return Structure(two_four, int(blocks.sum()), blocks.numel())


def _check(w: torch.Tensor, fmt: str) -> tuple[int, int]:
    if fmt not in FORMATS:
        raise GraphError(f"unknown sparse format {fmt!r}; one of {FORMATS}")
    if w.dim() != 2:
        raise GraphError(f"a {fmt} weight is a matrix, not of shape {tuple(w.shape)}")
    k, n = w.shape
    unit = (4, 1) if fmt == "sparse24" else (BLOCK, BLOCK)
    if k % unit[0] or n % unit[1]:
        raise GraphError(f"a {fmt} weight needs K % {unit[0]} == 0 and N % {unit[1]} == 0, "
                         f"not {tuple(w.shape)}")
    return k, n


@last_call
def pack(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, index) of the float weight w [K, N] in format `fmt`; a GraphError if w does
    not have the structure."""
    k, n = _check(w, fmt)
    w = w.detach()  # (values keep its float dtype: float32 in a program, float64 in rules check)
    if fmt == "sparse24":
        groups = w.reshape(k // 4, 4, n)
        nz = groups != 0
        if bool((nz.sum(1) > 2).any()):
            raise GraphError("the weight is not 2:4 sparse along K")
        # the kept positions: non-zeros first, then the lowest zeros, the two sorted
        rank = (~nz).to(torch.int64) * 4 + torch.arange(4)[None, :, None]  # distinct keys
        order = torch.argsort(rank, dim=1)[:, :2]
        kept = order.sort(1).values
        values = torch.gather(groups, 1, kept).reshape(k // 2, n)
        index = (kept[:, 0] | (kept[:, 1] << 2)).to(torch.uint8)
        return values.contiguous(), index.contiguous()
    tiles = w.reshape(k // BLOCK, BLOCK, n // BLOCK, BLOCK).permute(2, 0, 1, 3)  # [j, i, 16, 16]
    stored = (tiles != 0).flatten(2).any(2)  # [j, i]
    j_of, i_of = stored.nonzero(as_tuple=True)  # column-major order: j, then i ascending
    pointers = torch.zeros(n // BLOCK + 1, dtype=torch.int64)
    pointers[1:] = stored.sum(1).cumsum(0)
    values = tiles[j_of, i_of].contiguous()
    return values, torch.cat([pointers, i_of]).to(torch.int32)


def unpack(values: torch.Tensor, index: torch.Tensor, fmt: str, k: int, n: int) -> torch.Tensor:
    """The weight [K, N] (of the values' dtype) that (values, index) of format `fmt` stand for."""
    if fmt == "sparse24":
        positions = torch.stack([index & 3, (index >> 2) & 3], 1).to(torch.int64)  # [K/4, 2, N]
        w = torch.zeros(k // 4, 4, n, dtype=values.dtype)
        w.scatter_(1, positions, values.reshape(k // 4, 2, n))
        return w.reshape(k, n)
    nj = n // BLOCK
    pointers, rows = index[:nj + 1].to(torch.int64), index[nj + 1:].to(torch.int64)
    cols = torch.repeat_interleave(torch.arange(nj), pointers[1:] - pointers[:-1])
    tiles = torch.zeros(nj, k // BLOCK, BLOCK, BLOCK, dtype=values.dtype)
    tiles[cols, rows] = values
    return tiles.permute(1, 2, 0, 3).reshape(k, n)


def packed_types(w: TensorType, fmt: str, blocks: int) -> tuple[TensorType, TensorType]:
    """The types of (values, index) for a weight of type w with `blocks` stored blocks
    (bsr16; ignored for sparse24)."""
    if len(w.shape) != 2:
        raise GraphError(f"a {fmt} weight is a matrix, not {w}")
    k, n = w.shape
    if fmt == "sparse24" and k % 4 == 0:
        return TensorType((k // 2, n), w.dtype), TensorType((k // 4, n), "uint8")
    if fmt == "bsr16" and k % BLOCK == 0 and n % BLOCK == 0 and blocks > 0:
        return (TensorType((blocks, BLOCK, BLOCK), w.dtype),
                TensorType((n // BLOCK + 1 + blocks,), "int32"))
    raise GraphError(f"cannot store a weight {w} as {fmt} ({blocks} blocks)")
