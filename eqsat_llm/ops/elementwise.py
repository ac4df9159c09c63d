"""Elementwise ops, a table each: the torch function that is the op's meaning (and, called with
out=, its writer) and its vector work per element in flop-equivalents of an add (priced by the
cost model against the calibrated vector rate)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .registry import EXP_FLOPS, TRANSCENDENTAL, Writer, register

aten = torch.ops.aten

BINARY: dict[str, tuple[Callable[..., Any], float]] = {
    "add": (torch.add, 1.0), "sub": (torch.sub, 1.0), "mul": (torch.mul, 1.0),
    "div": (torch.div, 4.0),
    # pow: charged as the squares and small integer powers LLM graphs use (torch specialises)
    "pow": (torch.pow, 2.0),
    "maximum": (torch.maximum, 1.0), "minimum": (torch.minimum, 1.0),
    "eq": (torch.eq, 1.0), "ne": (torch.ne, 1.0), "lt": (torch.lt, 1.0), "le": (torch.le, 1.0),
    "gt": (torch.gt, 1.0), "ge": (torch.ge, 1.0),
    "logical_and": (torch.logical_and, 1.0), "logical_or": (torch.logical_or, 1.0),
    "bitwise_and": (torch.bitwise_and, 1.0), "bitwise_or": (torch.bitwise_or, 1.0),
}
# the binary ops whose result is bool (the C backend and the planned runtime read this too)
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"})

UNARY: dict[str, tuple[Callable[..., Any], float]] = {
    "neg": (torch.neg, 1.0), "rsqrt": (torch.rsqrt, 4.0), "sqrt": (torch.sqrt, 4.0),
    "exp": (torch.exp, EXP_FLOPS), "log": (torch.log, EXP_FLOPS),
    "expm1": (torch.expm1, EXP_FLOPS), "log1p": (torch.log1p, EXP_FLOPS),
    "tanh": (torch.tanh, TRANSCENDENTAL), "sigmoid": (torch.sigmoid, TRANSCENDENTAL),
    "silu": (F.silu, TRANSCENDENTAL + 1), "relu": (torch.relu, 1.0),
    "reciprocal": (torch.reciprocal, 4.0), "abs": (torch.abs, 1.0),
    "cos": (torch.cos, TRANSCENDENTAL), "sin": (torch.sin, TRANSCENDENTAL),
    "erf": (torch.erf, TRANSCENDENTAL), "floor": (torch.floor, 1.0),
    "logical_not": (torch.logical_not, 1.0), "bitwise_not": (torch.bitwise_not, 1.0),
}
# writers where the function itself has no out= (torch.relu is clamp_min(x, 0))
UNARY_WRITERS: dict[str, Writer] = {
    "relu": lambda out, xs, a: torch.clamp_min(xs[0], 0, out=out),
    "silu": lambda out, xs, a: aten.silu.out(xs[0], out=out),
}


def _binary(fn: Callable[..., Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    def ref(xs: list[Any], a: dict[str, Any]) -> Any:
        x, y = xs
        if not isinstance(x, torch.Tensor):  # scalar first: let torch promote as in eager
            return fn(torch.scalar_tensor(x, dtype=weak_scalar_dtype(x, y)), y)
        return fn(x, y)
    return ref


def weak_scalar_dtype(x: Any, y: Any) -> torch.dtype:
    """The dtype a Python number `x` takes next to `y` in a binary op, as torch promotes it
    (shared with the planned runtime)."""
    if isinstance(y, torch.Tensor) and not (isinstance(x, float) and
                                            not y.dtype.is_floating_point):
        return y.dtype
    return torch.get_default_dtype() if isinstance(x, float) else torch.int64


def _unary(fn: Callable[[Any], Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    return lambda xs, a: fn(xs[0])


def _out_writer(fn: Callable[..., Any]) -> Writer:
    return lambda out, xs, a: fn(*xs, out=out)


for _name, (_fn, _flops) in BINARY.items():
    register(_name, 2, ref=_binary(_fn), category="elementwise", shape="broadcast",
             dtype="bool" if _name in COMPARISONS else "promote", cost="vector", flops=_flops,
             writer=_out_writer(_fn))

register("where", 3, ref=lambda xs, a: torch.where(*xs), category="elementwise",
         shape="broadcast", dtype="promote12", cost="vector", flops=1.0,
         writer=_out_writer(torch.where))

for _name, (_fn, _flops) in UNARY.items():
    register(_name, 1, ref=_unary(_fn), category="elementwise", shape="same",
             dtype="bool" if _name == "logical_not" else "same", cost="vector", flops=_flops,
             writer=UNARY_WRITERS.get(_name) or _out_writer(_fn))
register("gelu", 1, "approximate:str",
         ref=lambda xs, a: F.gelu(xs[0], approximate=a["approximate"]),
         category="elementwise", shape="same", cost="vector", flops=TRANSCENDENTAL + 5,
         writer=lambda out, xs, a: aten.gelu.out(xs[0], approximate=a["approximate"], out=out))
register("triu", 1, "diagonal:int", ref=lambda xs, a: torch.triu(xs[0], a["diagonal"]),
         category="elementwise", shape="same", cost="vector", flops=1.0,
         writer=lambda out, xs, a: torch.triu(xs[0], a["diagonal"], out=out))
register("tril", 1, "diagonal:int", ref=lambda xs, a: torch.tril(xs[0], a["diagonal"]),
         category="elementwise", shape="same", cost="vector", flops=1.0,
         writer=lambda out, xs, a: torch.tril(xs[0], a["diagonal"], out=out))
