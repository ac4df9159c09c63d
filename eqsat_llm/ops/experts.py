"""Mixture-of-experts ops: a router's top-k choice and the expert GEMM.

    topk_values(x)   the k largest (or smallest) entries along `dim`, in order
    topk_indices(x)  where they are (int64): aten.topk's two results as two ops (the IR has
                     single-output ops; each kernel selects over a row of a few experts)
    expert_mm(x, w, w_scale, ids; weight, n)  out[s] = x[s] @ W[ids[s]]: every row of x
                     times the weight of the expert it was routed to (x [S, K], ids [S] ->
                     [S, n]); transformers' grouped and batched expert GEMMs are this op once
                     the frontend has taken their sorting apart (capture/moe_forms.py). At
                     decode it reads only the chosen experts' weights. `weight` "float": W = w
                     [E, K, n] (w_scale the scalar 0.0); a stored format (quant_formats: int8,
                     fp8_e4m3, int4_g32, ...): w and w_scale are the integers and scales of the
                     experts side by side, `experts_matrix(W)` = [K, E * n], so that expert e
                     is its columns [e n, (e + 1) n): each expert's output channels get their
                     own scales, as a dense weight's do; a half format (fp16, bf16): w is
                     experts_matrix(W) in that dtype, its values unchanged (w_scale 0.0).

Ties in top-k: torch leaves the order of equal values unspecified, but a router fed equal
scores (a zero-initialised gate) chooses its experts by it; the C kernel follows torch's CPU
algorithm so that it chooses as eager does (codegen/c/kernels/topk.c)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import GraphError
from ..formats.half_formats import WEIGHT_FORMATS as HALF_FORMATS
from ..formats.quant_formats import FORMATS, dequantize, quantized_types
from ..tensor_type import TensorType
from . import draws
from .registry import COPY_IN, register


def _topk(xs: list[Any], a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(xs[0], a["k"], a["dim"], largest=a["largest"], sorted=True)


def experts_matrix(w: torch.Tensor) -> torch.Tensor:
    """The experts' weights [E, K, N] side by side as one [K, E * N] matrix (expert e's
    columns [e N, (e + 1) N)): what a stored format quantizes, per column as a dense weight."""
    return w.permute(1, 0, 2).reshape(w.shape[1], -1)


def expert_weights(w: torch.Tensor, w_scale: Any, weight: str, n: int) -> torch.Tensor:
    """The float experts [E, K, n] that expert_mm's w (and w_scale) stand for."""
    if weight == "float":
        return w
    full = w.float() if weight in HALF_FORMATS else dequantize(w, w_scale, weight)
    return full.reshape(full.shape[0], -1, n).permute(1, 0, 2)


def expert_mm(x: torch.Tensor, w: torch.Tensor, w_scale: Any, ids: torch.Tensor,
              weight: str = "float", n: int | None = None) -> torch.Tensor:
    """The reference: each expert's rows times its weight (one product per expert used)."""
    w = expert_weights(w, w_scale, weight, w.shape[-1] if n is None else n).to(x.dtype)
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
    x, w, w_scale, ids = ts
    n, weight = a["n"], a["weight"]
    if len(x.shape) != 2 or ids.shape != x.shape[:1] or not ids.dtype.startswith("int"):
        raise GraphError(f"expert_mm takes x [S, K] and integer ids [S]; got {x}, {ids}")
    if weight == "float":
        if len(w.shape) != 3 or w.shape[1:] != (x.shape[1], n):
            raise GraphError(f"expert_mm takes float experts [E, K, N] = [E, {x.shape[1]}, "
                             f"{n}]; got {w}")
    elif weight in HALF_FORMATS:
        if w.dtype != HALF_FORMATS[weight] or len(w.shape) != 2 or w.shape[1] % n or \
                w.shape[0] != x.shape[1]:
            raise GraphError(f"expert_mm in {weight}: w must be [{x.shape[1]}, E * {n}] experts "
                             f"in {HALF_FORMATS[weight]}; got {w}")
    elif weight not in FORMATS or len(w.shape) != 2 or w.shape[1] % n or \
            quantized_types(TensorType((x.shape[1], w.shape[1]), "float32"), weight) != (
                TensorType(w.shape, w.dtype), TensorType(w_scale.shape, w_scale.dtype)):
        raise GraphError(f"expert_mm in {weight}: w and w_scale must be the integers and "
                         f"scales of [{x.shape[1]}, E * {n}] experts; got {w}, {w_scale}")
    return TensorType((x.shape[0], n), x.dtype)


register("expert_mm", 4, "weight:str n:int",
         ref=lambda xs, a: expert_mm(*xs, weight=a["weight"], n=a["n"]), category="matmul",
         shape="given", dtype="same", cost="matmul", writer=COPY_IN,
         operands="x w w_scale ids", infer=_expert_mm_type, packs_strided="w",
         draw=draws.experts)


def add_expert_mm(graph: Any, x: int, w: int, ids: int) -> int:
    """Append a float expert_mm of the experts w [E, K, N] to `graph` (an ir.Graph), w_scale
    the scalar 0.0. Returns its id."""
    zero = graph.add("scalar", value=0.0, kind="float")
    return graph.add("expert_mm", (x, w, zero, ids), weight="float",
                     n=graph.type_of(w).shape[-1])
