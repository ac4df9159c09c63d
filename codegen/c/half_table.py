"""An embedding table held in bfloat16: a float32 table whose values are all bfloat16 values
(a bf16 checkpoint's, widened by the model's own cast) is kept as its bf16 bits and widened
row by row as the gather copies it (exact: a bfloat16 is the top half of its float32). Half
the table's bytes: 0.13 GB at the TinyLlama shape, 0.26 GB at LLaMA-7B's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...formats.half import exact_half_dtypes
from ...weights.lazy_weights import WeightRef, narrowed


def holds_bfloat16(table: torch.Tensor) -> bool:
    """Whether every value of the float32 table is a bfloat16 value: read off a meta
    table's recipe (a widening of a bf16 weight, lazy_weights.narrowed), else its values."""
    if table.dtype != torch.float32 or table.dim() != 2:
        return False
    if table.is_meta:
        half = narrowed(table)
        return (half.meta if isinstance(half, WeightRef) else half).dtype == torch.bfloat16
    return "bfloat16" in exact_half_dtypes(table)


@dataclass(frozen=True)
class HalfTable:
    """A prepared constant: the contiguous float32 table `name` [rows, d] as bfloat16 bits
    (int16). Made from the narrowed recipe where the constants make it on access (no float32
    copy of the table), else by rounding (exact: holds_bfloat16)."""
    name: str
    rows: int
    d: int

    def prepare(self, constants: Any) -> torch.Tensor:
        value = (constants.narrowed(self.name) if hasattr(constants, "narrowed")
                 else constants[self.name]).detach()
        if tuple(value.shape) != (self.rows, self.d):
            raise ValueError(f"HalfTable: {self.name} is {tuple(value.shape)}")
        return value.to(torch.bfloat16).contiguous().view(torch.int16)
