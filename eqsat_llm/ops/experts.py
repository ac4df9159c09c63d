"""Mixture-of-experts ops: a router's top-k choice and the expert GEMM.

    topk_values(x)   the k largest (or smallest) entries along `dim`, in order
    topk_indices(x)  where they are (int64): aten.topk's two results as two ops (the IR has
                     single-output ops; each kernel selects over a row of a few experts)
    expert_mm(x, w, ids)  out[s] = x[s] @ w[ids[s]]: every row of x times the weight of the
                     expert it was routed to (x [S, K], w [E, K, N], ids [S] -> [S, N]);
                     transformers' grouped and batched expert GEMMs are this op once the
                     frontend has taken their sorting apart (capture/moe_forms.py). At decode
                     it reads only the chosen experts' weights.

Ties in top-k: torch leaves the order of equal values unspecified, but a router fed equal
scores (a zero-initialised gate) chooses its experts by it; the C kernel follows torch's CPU
algorithm so that it chooses as eager does (codegen/c/kernels/topk.c)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import GraphError
from ..tensor_type import TensorType
from .registry import COPY_IN, register


def _topk(xs: list[Any], a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(xs[0], a["k"], a["dim"], largest=a["largest"], sorted=True)


def expert_mm(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The reference: each expert's rows times its weight (one product per expert used)."""
    out = x.new_zeros(x.shape[0], w.shape[2])
    if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < w.shape[0]:
        raise IndexError(f"expert ids out of range [0, {w.shape[0]})")
    for e in torch.unique(ids).tolist():
        rows = (ids == e).nonzero().flatten()
        out[rows] = x[rows] @ w[e]
    return out


register("topk_values", 1, "k:int dim:int largest:bool", ref=lambda xs, a: _topk(xs, a)[0],
         category="reduction", shape="given", dtype="same", cost="gather", writer=COPY_IN)
register("topk_indices", 1, "k:int dim:int largest:bool", ref=lambda xs, a: _topk(xs, a)[1],
         category="reduction", shape="given", dtype="given", cost="gather", writer=COPY_IN)


def _expert_mm_type(ts: list[TensorType], a: dict[str, Any]) -> TensorType:
    x, w, ids = ts
    if len(x.shape) != 2 or len(w.shape) != 3 or ids.shape != x.shape[:1] or \
            w.shape[1] != x.shape[1] or not ids.dtype.startswith("int"):
        raise GraphError(f"expert_mm takes x [S, K], w [E, K, N] and integer ids [S]; got "
                         f"{x}, {w}, {ids}")
    return TensorType((x.shape[0], w.shape[2]), x.dtype)


register("expert_mm", 3, ref=lambda xs, a: expert_mm(*xs), category="matmul", shape="given",
         dtype="same", cost="matmul", writer=COPY_IN, operands="x w ids",
         infer=_expert_mm_type, packs_strided="w")
