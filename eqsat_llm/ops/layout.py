"""Layout: views and copies that move data but compute nothing (a view op whose result must be
a buffer of its own is a copy). Priced as views (free) or copies (bytes moved)."""

from __future__ import annotations

from typing import Any

import torch

from ..tensor_type import dtype_of
from .registry import COPY_IN, register

aten = torch.ops.aten


def _reshape_copy(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    out.view(xs[0].shape).copy_(xs[0])  # torch.reshape's copy is contiguous, and so is out


def _copy(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    out.copy_(xs[0])


register("view", 1, "shape:ints", ref=lambda xs, a: torch.reshape(xs[0], a["shape"]),
         category="layout", shape="attr", cost="view", writer=_reshape_copy, may_view=True)
register("permute", 1, "dims:ints", ref=lambda xs, a: torch.permute(xs[0], a["dims"]),
         category="layout", shape="permute", cost="copy", writer=COPY_IN, may_view=True)
register("transpose", 1, "dim0:int dim1:int",
         ref=lambda xs, a: torch.transpose(xs[0], a["dim0"], a["dim1"]),
         category="layout", shape="transpose", cost="copy", writer=COPY_IN, may_view=True)
register("expand", 1, "shape:ints", ref=lambda xs, a: xs[0].expand(a["shape"]),
         category="layout", shape="attr", cost="view", writer=COPY_IN, may_view=True)
register("unsqueeze", 1, "dim:int", ref=lambda xs, a: torch.unsqueeze(xs[0], a["dim"]),
         category="layout", shape="unsqueeze", cost="view", writer=COPY_IN, may_view=True)
register("clone", 1, ref=lambda xs, a: torch.clone(xs[0]), category="layout", shape="same",
         cost="copy", writer=_copy)
register("to_dtype", 1, "dtype:str", ref=lambda xs, a: xs[0].to(dtype_of(a["dtype"])),
         category="elementwise", shape="same", dtype="attr", cost="copy", writer=_copy)
register("slice", 1, "dim:int start:int end:int step:int",
         ref=lambda xs, a: aten.slice.Tensor(xs[0], a["dim"], a["start"], a["end"], a["step"]),
         category="layout", shape="slice", cost="view", writer=COPY_IN, may_view=True)
register("select", 1, "dim:int index:int",
         ref=lambda xs, a: torch.select(xs[0], a["dim"], a["index"]),
         category="layout", shape="select", cost="view", writer=COPY_IN, may_view=True)
register("cat", None, "dim:int", ref=lambda xs, a: torch.cat(xs, a["dim"]),
         category="layout", shape="cat", cost="copy",
         writer=lambda out, xs, a: torch.cat(xs, a["dim"], out=out))
register("getitem", 1, "index:int", ref=lambda xs, a: xs[0][a["index"]], category="layout",
         shape="given", dtype="given", cost="view", writer=COPY_IN)
