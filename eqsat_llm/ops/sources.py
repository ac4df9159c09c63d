"""Sources: leaves bound at run time (inputs, parameters, constants), scalars, and tensors
generated from their attributes."""

from __future__ import annotations

from typing import Any

import torch

from ..tensor_type import TensorType, dtype_of
from .registry import leaf_type, register, typed_number


def _scalar_value(a: dict[str, Any]) -> Any:
    kind, v = a["kind"], a["value"]
    return {"float": float, "int": int, "bool": bool}[kind](v)


def _scalar_type(_: list[TensorType], a: dict[str, Any]) -> TensorType:
    return TensorType((), "py_" + a["kind"])


def _range(a: dict[str, Any]) -> tuple[float | int, ...]:
    return tuple(typed_number(a[k], a["dtype"]) for k in ("start", "end", "step"))


register("input", 0, "name:str index:int", category="source", shape="given", dtype="given",
         cost="leaf", infer=leaf_type)
register("param", 0, "name:str", category="source", shape="given", dtype="given",
         cost="leaf", infer=leaf_type)
register("const", 0, "name:str", category="source", shape="given", dtype="given",
         cost="leaf", infer=leaf_type)
register("scalar", 0, "value:float kind:str", category="source", shape="scalar",
         dtype="scalar", cost="leaf", ref=lambda xs, a: _scalar_value(a), infer=_scalar_type)
register("full", 0, "shape:ints value:float dtype:str", category="source", shape="attr",
         dtype="attr", cost="generate",
         ref=lambda xs, a: torch.full(a["shape"], typed_number(a["value"], a["dtype"]),
                                      dtype=dtype_of(a["dtype"])),
         writer=lambda out, xs, a: out.fill_(typed_number(a["value"], a["dtype"])))
register("arange", 0, "start:float end:float step:float dtype:str", category="source",
         shape="given", dtype="attr", cost="generate",
         ref=lambda xs, a: torch.arange(*_range(a), dtype=dtype_of(a["dtype"])),
         writer=lambda out, xs, a: torch.arange(*_range(a), out=out))
