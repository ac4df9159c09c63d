"""bf16 / fp16 models on the C backend: a pass from graph to graph that computes in float32.

The C kernels are float32. A half-precision model's graph is rewritten so that its values are
float32: each half-precision input, weight and constant is read through `to_dtype(., float32)`
(for weights a conversion constant folding does once, at compile time), every op that made a
half value makes a float32 one (a `to_dtype`/`full`/`arange` to half now makes float32), and
each half output is converted back at the end, so the program takes and returns what the model
does. Computing in float32 rounds once where eager rounds after every op: the results are
within the dtype's own tolerance of eager's, not bit-identical (tests/test_half.py). The
weights are then held as float32 (twice the checkpoint's bytes; `quantize=` stores them as
int8/int4 instead).
"""

from __future__ import annotations

from .ir import Graph, TensorType, ValueType

HALF = frozenset({"bfloat16", "float16"})
DTYPE_ATTR_OPS = frozenset({"to_dtype", "full", "arange"})


def has_half(graph: Graph) -> bool:
    return any(_is_half(n.type) for n in graph.nodes)


def _is_half(t: ValueType) -> bool:
    if isinstance(t, tuple):
        return any(_is_half(x) for x in t)
    return t.dtype in HALF


def _widened(t: ValueType) -> ValueType:
    if isinstance(t, tuple):
        return tuple(_widened(x) for x in t)  # type: ignore[return-value]
    return TensorType(t.shape, "float32") if t.dtype in HALF else t


def compute_in_float32(graph: Graph) -> Graph:
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
