"""bf16 / fp16 models on the C backend: a pass from graph to graph that computes in float32.

The C kernels are float32. A half-precision model's graph is rewritten so that its values are
float32: each half-precision input, weight and constant is read through `to_dtype(., float32)`
(for weights a conversion constant folding does once, at compile time), every op that made a
half value makes a float32 one (a `to_dtype`/`full`/`arange` to half now makes float32), and
each half output is converted back at the end, so the program takes and returns what the model
does. Computing in float32 rounds once where eager rounds after every op: the results are
within the dtype's own tolerance of eager's, not bit-identical (tests/test_half.py). The
weights are then held as float32 (twice the checkpoint's bytes; `quantize=` stores them as
int8/int4 instead). A float32 model (no half input or weight) that casts to half explicitly
keeps that cast's rounding: x.to(float16).float() is not x.
"""

from __future__ import annotations

import torch

from ..ir import Graph, TensorType, ValueType
from .half_formats import FORMAT_OF, WEIGHT_FORMATS

__all__ = ["FORMAT_OF", "HALF", "WEIGHT_FORMATS", "compute_in_float32", "exact_half_dtypes",
           "has_half"]

HALF = frozenset(WEIGHT_FORMATS.values())
DTYPE_ATTR_OPS = frozenset({"to_dtype", "full", "arange"})


def has_half(graph: Graph) -> bool:
    return any(_is_half(n.type) for n in graph.nodes)


def exact_half_dtypes(value: torch.Tensor) -> list[str]:
    """The half dtypes that hold every value of `value` exactly: its own if it is half; for a
    float32 or float64 matrix, or a mixture's experts [E, K, N], those it happens to fit (a
    half checkpoint loaded as float32), read off its values (its first row first: most
    float32 weights fail there); else none."""
    dt = str(value.dtype).removeprefix("torch.")
    if dt in HALF:
        return [dt]
    # a meta tensor has no values to read: not known to fit (docs/memory.md, meta models)
    if value.dtype not in (torch.float32, torch.float64) or value.dim() not in (2, 3) or \
            value.is_meta:
        return []
    value = value.detach()
    first_row = value[(slice(0, 1),) * (value.dim() - 1)]  # (a view: an expert's first row)

    def fits(dt: str, v: torch.Tensor) -> bool:
        return torch.equal(v.to(getattr(torch, dt)).to(v.dtype), v)
    return [dt for dt in sorted(HALF) if fits(dt, first_row) and fits(dt, value)]


def _is_half(t: ValueType) -> bool:
    if isinstance(t, tuple):
        return any(_is_half(x) for x in t)
    return t.dtype in HALF


def _widened(t: ValueType) -> ValueType:
    if isinstance(t, tuple):
        return tuple(_widened(x) for x in t)  # type: ignore[return-value]
    return TensorType(t.shape, "float32") if t.dtype in HALF else t


def compute_in_float32(graph: Graph) -> Graph:
    # A float32 model's explicit casts to half keep their rounding (the cast runs, as a torch
    # step on C); a half model's (its inputs or weights half) are computed in float32, like
    # the rest of it: within the dtype's tolerance of eager, and its kernels stay fused.
    round_casts = not any(_is_half(n.type) for n in graph.nodes
                          if n.op in ("input", "param", "const"))
    out = Graph(constants=dict(graph.constants))
    remap: dict[int, int] = {}
    for node in graph.nodes:
        inputs = tuple(remap[i] for i in node.inputs)
        if node.op in ("input", "param", "const"):
            leaf = out.append(node.op, inputs, node.attrs, node.type)
            remap[node.id] = leaf if not _is_half(node.type) else out.append(
                "to_dtype", (leaf,), {"dtype": "float32"}, _widened(node.type))
            continue
        attrs = dict(node.attrs)
        if round_casts and node.op == "to_dtype" and attrs.get("dtype") in HALF \
                and not _is_half(graph.node(node.inputs[0]).type):
            # an explicit cast down from float32 (float64, ints) rounds as eager's does:
            # dropping it would change what a comparison of the result answers
            half = out.append("to_dtype", inputs, attrs, node.type)
            remap[node.id] = out.append("to_dtype", (half,), {"dtype": "float32"},
                                        _widened(node.type))
            continue
        if node.op in DTYPE_ATTR_OPS and attrs.get("dtype") in HALF:
            attrs["dtype"] = "float32"
        remap[node.id] = out.append(node.op, inputs, attrs, _widened(node.type))
    outputs = []
    for nid in graph.outputs:
        t = graph.node(nid).type
        new = remap[nid]
        if isinstance(t, TensorType) and t.dtype in HALF:
            new = out.append("to_dtype", (new,), {"dtype": t.dtype}, t)
        outputs.append(new)
    out.outputs = outputs
    return out
