"""The activations a gemm applies last (its `act` attribute), each declared once for every
stage that reads it: the fusion rules, the cost model, the planned runtime and the C
backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Activation:
    """An activation a gemm applies last (its `act` attribute), declared once for every
    stage: its reference, the registry op it is (with attributes: what the fusion rules match
    and the cost model prices), the planned runtime's in-place op, and the C backend's code
    (eq_act's case in packed_gemm.py) and expression of a float v."""
    ref: Callable[[torch.Tensor], torch.Tensor]
    op: str
    attrs: tuple[tuple[str, Any], ...]
    inplace: Callable[[torch.Tensor], Any]
    code: int
    c_expr: str


ACTIVATIONS: dict[str, Activation] = {
    # (written so that NaN stays NaN, as torch.relu keeps it)
    "relu": Activation(torch.relu, "relu", (), torch.relu_, 1, "v < 0.0f ? 0.0f : v"),
    "silu": Activation(F.silu, "silu", (), torch.ops.aten.silu_, 2, "v * eq_sigmoidf(v)"),
    "gelu_tanh": Activation(
        lambda x: F.gelu(x, approximate="tanh"), "gelu", (("approximate", "tanh"),),
        lambda t: torch.ops.aten.gelu_(t, approximate="tanh"), 3,
        "0.5f * v * (1.0f + eq_tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))"),
    "gelu": Activation(
        lambda x: F.gelu(x, approximate="none"), "gelu", (("approximate", "none"),),
        lambda t: torch.ops.aten.gelu_(t, approximate="none"), 4,
        "0.5f * v * (1.0f + erff(v * 0.7071067811865476f))"),
}

