"""Elementwise kernels, generated: one Triton kernel per elementwise node or fused chain (the
groups of codegen/c/fuse_elementwise.py, whose safety rules hold for any backend on the same
memory plan), specialised like the C kernels to static shapes and strides.

A kernel walks the root's output as a flat index in blocks, unravels it over the merged dims,
loads every input through its own (broadcast) strides, computes each member in registers and
stores the root. Math is float32 for float16/bfloat16/float32 values (what torch's kernels
compute in; a fused intermediate is rounded to its own dtype, as if stored); float64 and an
exponent other than 2, 3, 0.5, -1, -2 are declined (the node runs in torch)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...ir import Graph, Node
from ...ops import COMPARISONS
from ..c.fuse_elementwise import Group
from ..c.loops import broadcast_strides, collapse
from .launch import FLOATS, Launch, Operand, interpreting

TL_DTYPES = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
             "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8",
             "uint8": "tl.uint8", "bool": "tl.int1"}

# op -> expression of the arguments (already in the compute type)
Expr = Callable[[list[str], dict[str, Any]], str]
_POW = {2.0: "({0} * {0})", 3.0: "({0} * {0} * {0})", 0.5: "tl.sqrt({0})",
        -1.0: "(1.0 / {0})", -2.0: "(1.0 / ({0} * {0}))"}


def _minmax(cmp: str) -> Expr:  # NaN wins, as in torch
    return lambda a, at: f"tl.where(({a[0]} != {a[0]}) | ({a[0]} {cmp} {a[1]}), {a[0]}, {a[1]})"


BINARY: dict[str, Expr] = {
    "add": lambda a, at: f"({a[0]} + {a[1]})",
    "sub": lambda a, at: f"({a[0]} - {a[1]})",
    "mul": lambda a, at: f"({a[0]} * {a[1]})",
    "div": lambda a, at: f"({a[0]} / {a[1]})",
    "maximum": _minmax(">"),
    "minimum": _minmax("<"),
    "eq": lambda a, at: f"({a[0]} == {a[1]})",
    "ne": lambda a, at: f"({a[0]} != {a[1]})",
    "lt": lambda a, at: f"({a[0]} < {a[1]})",
    "le": lambda a, at: f"({a[0]} <= {a[1]})",
    "gt": lambda a, at: f"({a[0]} > {a[1]})",
    "ge": lambda a, at: f"({a[0]} >= {a[1]})",
    "logical_and": lambda a, at: f"(({a[0]} != 0) & ({a[1]} != 0))",
    "logical_or": lambda a, at: f"(({a[0]} != 0) | ({a[1]} != 0))",
    "bitwise_and": lambda a, at: f"({a[0]} & {a[1]})",
    "bitwise_or": lambda a, at: f"({a[0]} | {a[1]})",
}
FLOAT_UNARY: dict[str, Expr] = {
    "neg": lambda a, at: f"(-{a[0]})",
    "rsqrt": lambda a, at: f"(1.0 / tl.sqrt({a[0]}))",
    "sqrt": lambda a, at: f"tl.sqrt({a[0]})",
    "exp": lambda a, at: f"tl.exp({a[0]})",
    "log": lambda a, at: f"tl.log({a[0]})",
    # (no libdevice in Triton's interpreter: Kahan's forms, accurate near 0 where
    # log(1 + x) and exp(x) - 1 lose the low bits; exact limits at u == 1)
    "expm1": lambda a, at: (f"tl.where(tl.exp({a[0]}) == 1.0, {a[0]}, tl.where("
                            f"tl.exp({a[0]}) - 1.0 == -1.0, -1.0, (tl.exp({a[0]}) - 1.0) * "
                            f"{a[0]} / tl.log(tl.exp({a[0]}))))"),
    "log1p": lambda a, at: (f"tl.where(1.0 + {a[0]} == 1.0, {a[0]}, tl.log(1.0 + {a[0]}) * "
                            f"{a[0]} / ((1.0 + {a[0]}) - 1.0))"),
    "tanh": lambda a, at: f"tanh({a[0]})",
    "sigmoid": lambda a, at: f"tl.sigmoid({a[0]})",
    "silu": lambda a, at: f"({a[0]} * tl.sigmoid({a[0]}))",
    "relu": lambda a, at: f"tl.where({a[0]} < 0.0, 0.0, {a[0]})",
    "reciprocal": lambda a, at: f"(1.0 / {a[0]})",
    "abs": lambda a, at: f"tl.abs({a[0]})",
    "cos": lambda a, at: f"tl.cos({a[0]})",
    "sin": lambda a, at: f"tl.sin({a[0]})",
    "erf": lambda a, at: f"tl.erf({a[0]})",
    "floor": lambda a, at: f"tl.floor({a[0]})",
    "gelu": lambda a, at: (
        f"(0.5 * {a[0]} * (1.0 + tanh(0.7978845608028654 * ({a[0]} + 0.044715 * {a[0]} * "
        f"{a[0]} * {a[0]}))))" if at["approximate"] == "tanh" else
        f"({a[0]} * 0.5 * (1.0 + tl.erf({a[0]} * 0.7071067811865476)))"),
    "swiglu": lambda a, at: f"({a[0]} * tl.sigmoid({a[0]}) * {a[1]})",
}
OTHER: dict[str, Expr] = {
    "where": lambda a, at: f"tl.where({a[0]} != 0, {a[1]}, {a[2]})",
    "logical_not": lambda a, at: f"({a[0]} == 0)",
    "to_dtype": lambda a, at: a[0],
    "clone": lambda a, at: a[0],
}
ELEMENTWISE_OPS = frozenset(BINARY) | frozenset(FLOAT_UNARY) | frozenset(OTHER) | {"pow"}


def compute_dtype(node: Node, out: Operand, ins: list[Operand]) -> str | None:
    """The dtype an op computes in (float32 for every float), or None: not generated."""
    dts = {o.dtype for o in ins if not o.is_scalar}
    if out.dtype == "float64" or "float64" in dts:
        return None
    if node.op in ("to_dtype", "clone"):  # the conversion happens in the expression
        src = ins[0].dtype
        return "float32" if src in FLOATS else src if src in TL_DTYPES else None
    if node.op in COMPARISONS:
        if dts <= FLOATS:
            return "float32"
        return dts.pop() if len(dts) == 1 and dts <= set(TL_DTYPES) else None
    if node.op in FLOAT_UNARY or node.op in ("div", "pow"):
        return "float32" if out.dtype in FLOATS else None
    if node.op in ("bitwise_and", "bitwise_or") and out.dtype in FLOATS:
        return None
    if out.dtype not in TL_DTYPES:
        return None
    return "float32" if out.dtype in FLOATS else out.dtype


def _exponent(ins: list[Operand]) -> float | None:
    e = ins[1].scalar if len(ins) > 1 else None
    return float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) else None


def element_expr(node: Node, out: Operand, ins: list[Operand]
                 ) -> tuple[str, Callable[[list[str]], str]] | None:
    """(compute dtype, args -> Triton expression) of one element, or None."""
    if node.op not in ELEMENTWISE_OPS:
        return None
    ct = compute_dtype(node, out, ins)
    if ct is None:
        return None
    if node.op == "pow":
        e = _exponent(ins)
        if e not in _POW:
            return None
        return ct, lambda a: _POW[e].format(a[0])
    table = BINARY if node.op in BINARY else FLOAT_UNARY if node.op in FLOAT_UNARY else OTHER
    fn = table[node.op]
    if node.op in ("to_dtype", "clone") and out.dtype == "bool":  # nonzero, not truncation
        return ct, lambda a: f"({a[0]} != 0)"
    return ct, lambda a: fn(a, node.attrs)


@dataclass
class Source:
    """The generated module's text: module constants and kernels, each named once."""
    constants: dict[str, str]
    kernels: list[str]

    def literal(self, v: float | bool) -> str:
        """A Python number as Triton reads it (non-finite floats as module constants)."""
        if isinstance(v, bool):
            return "1" if v else "0"
        if isinstance(v, int) or math.isfinite(v):
            return repr(v)
        name = {"inf": "INF", "-inf": "NEG_INF"}.get(repr(v), "NAN")
        self.constants[name] = f"tl.constexpr(float({repr(v)!r}))"
        return name


def block_size(numel: int) -> int:
    # the interpreter costs ~1.4 ms a program whatever its size: few, large blocks there
    cap = 1 << 16 if interpreting() else 1024
    return max(16, min(cap, 1 << max(numel - 1, 1).bit_length()))


def plan_group(graph: Graph, group: Group, operands: dict[int, Operand], name: str,
               source: Source, module: Callable[[], Any]) -> Launch | None:
    """The kernel computing `group` (one node or a fused chain; root last): its source is
    added to `source`, and the Launch reads the kernel from the loaded `module()`."""
    out = operands[group.root]
    inside = set(group.members)
    exprs = []
    for m in group.members:
        node = graph.node(m)
        e = element_expr(node, operands[m], [operands[i] for i in node.inputs])
        if e is None:
            return None
        exprs.append((m, node, e))
    tensors = [operands[i] for i in group.inputs]
    if any(t.dtype not in TL_DTYPES for t in tensors) or out.dtype not in TL_DTYPES:
        return None
    numel = math.prod(out.shape)
    strides = [out.strides] + [broadcast_strides(out.shape, t.shape, t.strides) for t in tensors]
    sizes, merged = collapse(out.shape, strides)
    offsets = _offsets(sizes, merged)
    block = block_size(numel)
    args = ", ".join(["o"] + [f"x{k}" for k in range(len(tensors))])
    lines = [f"# {', '.join(f'%{m} {node.op}' for m, node, _ in exprs)}",
             "@triton.jit",
             f"def {name}({args}, BLOCK: tl.constexpr):",
             "    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
             f"    m = i < {numel}"]
    lines += unravel(sizes)
    for k, t in enumerate(tensors):
        lines.append(f"    x{k}v = tl.load(x{k} + {offsets[k + 1]}, mask=m)")
    for m, node, (ct, expr) in exprs:
        args_ = []
        for i in node.inputs:
            if i in inside:
                args_.append(f"v{i}.to({TL_DTYPES[ct]})")
            elif operands[i].is_scalar:
                args_.append(source.literal(operands[i].scalar))  # type: ignore[arg-type]
            else:
                args_.append(f"x{group.inputs.index(i)}v.to({TL_DTYPES[ct]})")
        dt = TL_DTYPES[operands[m].dtype]
        # each member rounded to its own dtype, as if stored and loaded
        lines.append(f"    v{m} = ({expr(args_)}).to({dt})")
    lines.append(f"    tl.store(o + {offsets[0]}, v{group.root}, mask=m)")
    source.kernels.append("\n".join(lines))
    grid = (max(1, -(-numel // block)),)
    return Launch(name, Deferred(module, name), grid, [out, *tensors], {"BLOCK": block})


def plan_copy(name: str, shape: tuple[int, ...], out: Operand, out_strides: tuple[int, ...],
              out_offset: int, src: Operand, src_strides: tuple[int, ...], src_offset: int,
              source: Source, module: Callable[[], Any]) -> Launch | None:
    """A kernel copying `src` (read as `shape` through src_strides from src_offset) into
    `out` (written through out_strides from out_offset): the pieces of a cat, a reshape or a
    layout op torch computes as a copy."""
    if src.is_scalar or src.dtype not in TL_DTYPES or out.dtype not in TL_DTYPES:
        return None
    numel = math.prod(shape)
    if numel == 0:
        return None
    sizes, merged = collapse(shape, [out_strides, src_strides])
    out_at, src_at = _offsets(sizes, merged)
    block = block_size(numel)
    lines = ["@triton.jit", f"def {name}(o, x0, BLOCK: tl.constexpr):",
             "    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
             f"    m = i < {numel}", *unravel(sizes),
             f"    v = tl.load(x0 + {src_offset} + {src_at}, mask=m)",
             f"    tl.store(o + {out_offset} + {out_at}, v.to({TL_DTYPES[out.dtype]}), mask=m)"]
    source.kernels.append("\n".join(lines))
    return Launch(name, Deferred(module, name), (max(1, -(-numel // block)),), [out, src],
                  {"BLOCK": block})


def unravel(sizes: list[int]) -> list[str]:
    lines, rest = [], "i"
    for d in range(len(sizes) - 1, 0, -1):
        lines.append(f"    d{d} = {rest} % {sizes[d]}")
        lines.append(f"    r{d} = {rest} // {sizes[d]}")
        rest = f"r{d}"
    if sizes:
        lines.append(f"    d0 = {rest}")
    return lines


def _offsets(sizes: list[int], merged: list[list[int]]) -> list[str]:
    # a broadcast operand still needs a block of pointers: i * 0
    return [" + ".join(f"d{d} * {s}" for d, s in enumerate(st) if s) or "i * 0" for st in merged]


class Deferred:
    """A kernel of the generated module, looked up when first launched (the module is loaded
    after every kernel has been planned)."""

    def __init__(self, module: Callable[[], Any], name: str):
        self._module, self.__name__ = module, name

    def __getitem__(self, grid: Any) -> Any:
        return getattr(self._module(), self.__name__)[grid]
