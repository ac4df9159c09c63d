"""Half-precision weights, as rewrites: a GEMM on a constant weight W whose values are all
exactly float16 (or bfloat16) ones is the same GEMM on W stored in that dtype, which constant
folding converts once at compile time. Such weights are what half-precision models hold (their
weights are read through a conversion to float32: formats/half.py) and what a half checkpoint loaded
as float32 holds. The C kernel widens them in registers (codegen/c/quant_gemm.py); the cost
model prices their 2 bytes a weight, so at decode, where reading the weight is what costs,
extraction takes the half weight. Exact: the values are unchanged."""

import torch
from egglog import String, Vec, eq, i64

from eqsat_llm.egraph.analysis import HALF_EXACT, is_const, is_float_dtype
from eqsat_llm.egraph.language import E, Tensor, dtype, shape
from eqsat_llm.formats.half import WEIGHT_FORMATS
from eqsat_llm.rulebook import exact, family

from .fusion import NONE, stored_experts_rule, stored_weight_rules


def _rounded_to(dt: str):
    """`rules check`'s weights for a format: drawn, then rounded to its dtype."""
    def weights(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return w.to(getattr(torch, dt)).to(w.dtype) if w.dim() in (2, 3) else w
    return weights


@family("half-weights")
def half_weights(x: Tensor, w: Tensor, sw: Vec[i64]):
    for fmt, dt in WEIGHT_FORMATS.items():
        # W: a constant float matrix [K, N] (x @ W) whose values all fit dt
        weight = [is_const(w), HALF_EXACT[dt](w), eq(sw).to(shape(w)), eq(sw.length()).to(i64(2)),
                  is_float_dtype(dtype(w))]
        h = E.to_dtype(w, String(dt))
        note, check = f"W stored as {dt}: its values unchanged", {"check_weights": _rounded_to(dt)}
        matmul, gemm = stored_weight_rules(fmt, h, NONE, weight, x, w, sw)
        yield exact(f"{fmt}-matmul", matmul, note, **check)
        yield exact(f"{fmt}-gemm", gemm, note, **check)
        # a mixture's experts, side by side as one half weight
        experts = stored_experts_rule(fmt, lambda m, dt=dt: (E.to_dtype(m, String(dt)), NONE),
                                      HALF_EXACT[dt], x, w, sw)
        yield exact(f"{fmt}-experts", experts, note, **check)
