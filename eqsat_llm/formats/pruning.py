"""Pruning a model's weights into the structures optimize(sparsity="auto") skips: 2:4 along a
dim and zero 16 x 16 blocks. Pruning changes the model (it is the user's decision, and usually
followed by fine-tuning); these are for tests, benchmarks and trying the sparse kernels."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .sparse_formats import BLOCK


def prune_2_4(w: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """w with the 2 smallest of every 4 consecutive entries along `dim` zeroed (nn.Linear's
    [out, in] weight along its inputs, dim -1: 2:4 along K of the GEMM)."""
    m = w.detach().movedim(dim, 0)
    groups = m.reshape(m.shape[0] // 4, 4, -1)
    keep = groups.abs().argsort(1).argsort(1) >= 2
    return (groups * keep).reshape(m.shape).movedim(0, dim)


def prune_blocks(w: torch.Tensor, fraction: float = 0.5, seed: int = 0) -> torch.Tensor:
    """The matrix w with about `fraction` of its 16 x 16 blocks zeroed, drawn at random."""
    k, n = w.shape
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(k // BLOCK, 1, n // BLOCK, 1, generator=gen) >= fraction
    return w.detach() * keep.expand(-1, BLOCK, -1, BLOCK).reshape(k, n)


def prune_linears(model: nn.Module, prune: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """Every nn.Linear weight of `model` replaced, in place, by prune(weight)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(prune(m.weight))
    return model
