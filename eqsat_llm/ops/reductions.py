"""Reductions and normalisations over some dims of one input. Their vector work is counted per
input element (read once, written once), in flop-equivalents of an add."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import draws
from .registry import COPY_IN, EXP_FLOPS, Writer, register

aten = torch.ops.aten


def _reduction(fn: Callable[..., Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    return lambda xs, a: fn(xs[0], a["dims"], keepdim=a["keepdim"])


def _sum(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    kw = {"dtype": out.dtype} if xs[0].dtype != out.dtype else {}
    torch.sum(xs[0], a["dims"], a["keepdim"], out=out, **kw)


def _mean(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    if len(xs) == 1:  # reduced precision: torch's own mean (a scalar wrapper per call)
        torch.mean(xs[0], a["dims"], a["keepdim"], out=out)
    else:  # what mean.out does for float32/64 (sum, then divide by the count), count prepared
        torch.sum(xs[0], a["dims"], a["keepdim"], out=out).div_(xs[1])


def _extreme(fn: Callable[..., Any]) -> Writer:
    return lambda out, xs, a: fn(xs[0], a["dims"], a["keepdim"], out=out)


def _cumsum(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    if xs[0].dtype == out.dtype:
        torch.cumsum(xs[0], a["dim"], out=out)
    else:  # convert into the buffer first; cumsum would allocate the converted input
        out.copy_(xs[0])
        out.cumsum_(a["dim"])


# sum promotes bool/int to int64, so its dtype is not always its input's
register("sum", 1, "dims:ints keepdim:bool", ref=_reduction(torch.sum), category="reduction",
         shape="reduce", dtype="same_float", cost="vector", flops=1.0, writer=_sum)
register("mean", 1, "dims:ints keepdim:bool", ref=_reduction(torch.mean), category="reduction",
         shape="reduce", cost="vector", flops=1.0, writer=_mean)
register("amax", 1, "dims:ints keepdim:bool", ref=_reduction(torch.amax), category="reduction",
         shape="reduce", cost="vector", flops=1.0, writer=_extreme(torch.amax))
# the index of the first extreme along dim (the indices of torch.max / torch.min over a dim)
register("argmax", 1, "dim:int keepdim:bool",
         ref=lambda xs, a: torch.max(xs[0], a["dim"], keepdim=a["keepdim"])[1],
         category="reduction", shape="given", dtype="given", cost="vector", flops=1.0,
         writer=COPY_IN)
register("argmin", 1, "dim:int keepdim:bool",
         ref=lambda xs, a: torch.min(xs[0], a["dim"], keepdim=a["keepdim"])[1],
         category="reduction", shape="given", dtype="given", cost="vector", flops=1.0,
         writer=COPY_IN)
register("amin", 1, "dims:ints keepdim:bool", ref=_reduction(torch.amin), category="reduction",
         shape="reduce", cost="vector", flops=1.0, writer=_extreme(torch.amin))
# any: true where some element along the dims is non-zero (the masks' "some key visible")
register("any", 1, "dims:ints keepdim:bool",
         ref=lambda xs, a: torch.any(xs[0], a["dims"], keepdim=a["keepdim"]) if a["dims"]
         else torch.any(xs[0]).reshape([1] * xs[0].dim() if a["keepdim"] else []),
         category="reduction", shape="reduce", dtype="bool", cost="vector", flops=1.0,
         writer=COPY_IN)
# three passes over each row (max; exp and sum; scale): about three exps' worth
register("softmax", 1, "dim:int", ref=lambda xs, a: torch.softmax(xs[0], a["dim"]),
         category="reduction", shape="same", cost="vector", flops=3 * EXP_FLOPS,
         writer=lambda out, xs, a: aten._softmax.out(xs[0], a["dim"], False, out=out))
register("log_softmax", 1, "dim:int", ref=lambda xs, a: torch.log_softmax(xs[0], a["dim"]),
         category="reduction", shape="same", cost="vector", flops=3 * EXP_FLOPS,
         writer=lambda out, xs, a: aten._log_softmax.out(xs[0], a["dim"], False, out=out))
register("cumsum", 1, "dim:int", ref=lambda xs, a: torch.cumsum(xs[0], a["dim"]),
         category="reduction", shape="same", dtype="given", cost="vector", flops=1.0,
         writer=_cumsum)
# two passes: statistics (mean and variance), then normalise and scale. (Its out= kernel runs
# the functional op and copies, too.)
register("layer_norm", 3, "normalized_shape:ints eps:float",
         ref=lambda xs, a: F.layer_norm(xs[0], a["normalized_shape"], xs[1], xs[2], a["eps"]),
         category="reduction", shape="same", cost="vector", flops=12.0, writer=COPY_IN,
         draw=draws.norm)
