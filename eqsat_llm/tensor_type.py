"""Tensor types and dtype names: what the IR (`ir.py`), the op registry (`ops/`) and the
weight formats share. It imports nothing of the package, so each of them can read it: the
registry needs types, the IR needs the registry (`Graph.add` infers a node's type with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import GraphError

__all__ = ["TensorType", "ValueType", "dtype_name", "dtype_of"]


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype of a value. `dtype` is torch's name ("float32", "int64", "bool");
    scalars folded into the graph use the weak dtypes "py_float", "py_int", "py_bool"."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


# A node's value: one tensor, or a tuple of tensors (only fallback nodes produce tuples;
# `getitem` takes them apart).
ValueType = TensorType | tuple[TensorType, ...]


def dtype_of(name: str) -> torch.dtype:
    """torch dtype for a dtype name of the IR (raises GraphError for weak scalar dtypes)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise GraphError(f"{name!r} is not a torch dtype")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")
