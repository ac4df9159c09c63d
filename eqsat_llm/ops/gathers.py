"""Gathers: rows or elements of a table picked by index tensors. Priced by the rows they move
(the table is not read whole)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import draws
from .registry import COPY_IN, register

aten = torch.ops.aten


def _index_list(xs: list[Any], positions: list[int]) -> list[Any]:
    # aten.index's indices: tensors at `positions` and full slices (None) elsewhere
    indices: list[Any] = [None] * (max(positions) + 1)
    for p, t in zip(positions, xs[1:]):
        indices[p] = t
    return indices


def _embedding(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    weight, idx = xs  # F.embedding is index_select on the flattened indices
    torch.index_select(weight, 0, idx.reshape(-1), out=out.view(-1, weight.shape[1]))


register("embedding", 2, ref=lambda xs, a: F.embedding(xs[1], xs[0]), category="layout",
         shape="embedding", cost="gather", writer=_embedding, draw=draws.embedding)
register("index_select", 2, "dim:int",
         ref=lambda xs, a: torch.index_select(xs[0], a["dim"], xs[1]), category="layout",
         shape="given", cost="gather", draw=draws.index_select,
         writer=lambda out, xs, a: torch.index_select(xs[0], a["dim"], xs[1], out=out))
register("gather", 2, "dim:int", ref=lambda xs, a: torch.gather(xs[0], a["dim"], xs[1]),
         category="layout", shape="given", dtype="same", cost="gather", writer=COPY_IN)
register("index", None, "positions:ints",
         ref=lambda xs, a: aten.index.Tensor(xs[0], _index_list(xs, a["positions"])),
         category="layout", shape="given", dtype="same", cost="gather",
         writer=lambda out, xs, a: aten.index.Tensor_out(
             xs[0], _index_list(xs, a["positions"]), out=out))
# x with `value` written where index points along dim (DeepSeek's group mask, PhiMoE's)
register("scatter_value", 2, "dim:int value:float",
         ref=lambda xs, a: torch.scatter(xs[0], a["dim"], xs[1], _typed(a["value"], xs[0])),
         category="layout", shape="same", dtype="same", cost="gather", writer=COPY_IN)


def _typed(v: float, x: torch.Tensor) -> float | int | bool:
    return v if x.dtype.is_floating_point else bool(v) if x.dtype == torch.bool else int(v)
