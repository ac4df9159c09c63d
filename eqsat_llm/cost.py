"""The first cost model: a fixed weight per op category, enough to prefer the program with
fewer and cheaper kernels (a removed view beats a kept one; a scale folded into a matmul beats
a separate multiply). The physical roofline model replaces it (see docs/design notes).
"""

from __future__ import annotations

from .ops import REGISTRY

CATEGORY_COST = {
    "source": 0.0,
    "layout": 1.0,
    "elementwise": 2.0,
    "reduction": 3.0,
    "matmul": 10.0,
    "attention": 20.0,
    "fallback": 50.0,
}


def op_cost(op: str) -> float:
    """Cost of one e-node by its op name; literals (attributes) are free."""
    opdef = REGISTRY.get(op)
    if opdef is None:
        return 0.0
    if op == "scalar":  # a scalar is folded into its consumer's kernel
        return 0.0
    return CATEGORY_COST[opdef.category]
