"""Matrix products as captured (alpha: a scale folded into the product by the rules). The
rules turn them into the one `gemm` op (gemm.py) wherever a weight is a constant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import draws
from .registry import Writer, register

aten = torch.ops.aten


def scaled(x: torch.Tensor, alpha: float) -> torch.Tensor:
    # Multiplying by exactly 1.0 is skipped so that an unscaled product is bit-identical.
    return x if alpha == 1.0 else x * alpha


def _product(fn: Callable[..., Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    return lambda xs, a: scaled(fn(xs[0], xs[1]), a["alpha"])


def _product_writer(fn: Callable[..., Any]) -> Writer:
    def write(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
        fn(xs[0], xs[1], out=out)
        if a["alpha"] != 1.0:  # the reference multiplies the product by alpha (prepared: xs[2])
            out.mul_(xs[2])
    return write


register("mm", 2, "alpha:float", ref=_product(torch.mm), category="matmul", shape="mm",
         cost="matmul", writer=_product_writer(torch.mm), draw=draws.product(0, 1))
register("bmm", 2, "alpha:float", ref=_product(torch.bmm), category="matmul", shape="bmm",
         cost="matmul", writer=_product_writer(torch.bmm), draw=draws.bmm)
# matmul: batched over leading dims (b may be 2-D: x @ W); the rules rewrite the
# view/bmm/view and view/mm/view chains of the decompositions into it
register("matmul", 2, "alpha:float", ref=_product(torch.matmul), category="matmul",
         shape="matmul", cost="matmul", writer=_product_writer(torch.matmul), draw=draws.matmul)
register("addmm", 3, "beta:float alpha:float",
         ref=lambda xs, a: torch.addmm(xs[0], xs[1], xs[2], beta=a["beta"], alpha=a["alpha"]),
         category="matmul", shape="addmm", cost="matmul", draw=draws.product(1, 2),
         writer=lambda out, xs, a: torch.addmm(*xs, beta=a["beta"], alpha=a["alpha"], out=out))
register("linear", 2, ref=lambda xs, a: F.linear(xs[0], xs[1]), category="matmul",
         shape="linear", cost="matmul", draw=draws.linear,
         writer=lambda out, xs, a: aten.linear.out(xs[0], xs[1], None, out=out))
register("linear_bias", 3, ref=lambda xs, a: F.linear(xs[0], xs[1], xs[2]), category="matmul",
         shape="linear", cost="matmul", writer=lambda out, xs, a: aten.linear.out(*xs, out=out),
         draw=draws.linear)

# torch's products as captured, each a matmul kernel on both backends until the rules make
# them the gemm op (ops/gemm.py, also of category "matmul")
MATMUL_OPS = frozenset({"mm", "bmm", "matmul", "addmm", "linear", "linear_bias"})
