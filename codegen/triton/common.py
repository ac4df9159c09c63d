"""Device functions the kernels share: the activations of a gemm epilogue (by
`ops.ACTIVATIONS[name].code`), tanh (Triton's core language has none)."""

from __future__ import annotations

import triton
import triton.language as tl

from ...ops import ACTIVATIONS

ACT_NONE = 0
ACT_CODES = {"none": ACT_NONE, **{name: a.code for name, a in ACTIVATIONS.items()}}


@triton.jit
def tanh(x):
    # 2 sigmoid(2x) - 1, exact in float32 to a few ulp, and finite for every x
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def apply_act(v, ACT: tl.constexpr):
    """ACTIVATIONS[name] applied to a float32 block; ACT: its code (0: none)."""
    if ACT == 1:  # relu (NaN stays NaN, as in torch.relu)
        v = tl.where(v < 0.0, 0.0, v)
    elif ACT == 2:  # silu
        v = v * tl.sigmoid(v)
    elif ACT == 3:  # gelu, tanh approximation
        v = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
    elif ACT == 4:  # gelu
        v = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    return v
