"""Elementwise kernels: one strided loop nest per node, broadcasting by zero strides, scalars
inlined as literals. Also the copies that layout ops need (clone, to_dtype, a `view` that
torch cannot express as a view, cat, a strided view copied out)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ...ir import Node, contiguous_strides
from ...ops import COMPARISONS
from .loops import broadcast_strides, loop_nest
from .values import Ref

# expr(ctype, args) -> C expression; args are already in the compute type
Expr = Callable[[str, list[str], dict[str, Any]], str]


def _f(ct: str, name: str) -> str:
    return name + ("f" if ct == "float" else "")


def _exp(ct: str, x: str) -> str:
    return f"eq_expf({x})" if ct == "float" else f"exp({x})"


def _sig(ct: str, x: str) -> str:
    return f"eq_sigmoidf({x})" if ct == "float" else f"eq_sigmoid({x})"


def _tanh(ct: str, x: str) -> str:
    return f"eq_tanhf({x})" if ct == "float" else f"tanh({x})"


def _gelu(ct: str, a: list[str], at: dict[str, Any]) -> str:
    x = a[0]
    if at["approximate"] == "tanh":
        k = "0.7978845608028654"
        inner = f"({ct}){k} * ({x} + ({ct})0.044715 * {x} * {x} * {x})"
        return f"(({ct})0.5 * {x} * (({ct})1 + {_tanh(ct, inner)}))"
    return f"({x} * ({ct})0.5 * (({ct})1 + {_f(ct, 'erf')}({x} * ({ct})0.7071067811865476)))"


# torch's CPU pow with a scalar exponent special-cases these (PowKernel.cpp); doing the same
# is bit-identical to it and vectorises (powf does not)
_POW_SPECIAL = {2.0: "({x} * {x})", 3.0: "({x} * {x} * {x})", 0.5: "{sqrt}({x})",
                -1.0: "(({ct})1 / {x})", -2.0: "(({ct})1 / ({x} * {x}))"}
_LITERAL = re.compile(r"^\(\((?:float|double)\)(-?0x[0-9a-fA-F.]+p[+-]?\d+)\)$")


def _pow(ct: str, a: list[str], at: dict[str, Any]) -> str:
    literal = _LITERAL.match(a[1])
    if literal and ct in ("float", "double"):
        template = _POW_SPECIAL.get(float.fromhex(literal.group(1)))
        if template:
            return template.format(x=a[0], ct=ct, sqrt=_f(ct, "sqrt"))
    return f"{_f(ct, 'pow')}({a[0]}, {a[1]})" if ct in ("float", "double") else \
        f"(({ct})pow((double){a[0]}, (double){a[1]}))"


BINARY: dict[str, Expr] = {
    "add": lambda ct, a, at: f"({a[0]} + {a[1]})",
    "sub": lambda ct, a, at: f"({a[0]} - {a[1]})",
    "mul": lambda ct, a, at: f"({a[0]} * {a[1]})",
    "div": lambda ct, a, at: f"({a[0]} / {a[1]})",
    "pow": _pow,
    "maximum": lambda ct, a, at: f"(({a[0]} != {a[0]} || {a[0]} > {a[1]}) ? {a[0]} : {a[1]})",
    "minimum": lambda ct, a, at: f"(({a[0]} != {a[0]} || {a[0]} < {a[1]}) ? {a[0]} : {a[1]})",
    "eq": lambda ct, a, at: f"({a[0]} == {a[1]})",
    "ne": lambda ct, a, at: f"({a[0]} != {a[1]})",
    "lt": lambda ct, a, at: f"({a[0]} < {a[1]})",
    "le": lambda ct, a, at: f"({a[0]} <= {a[1]})",
    "gt": lambda ct, a, at: f"({a[0]} > {a[1]})",
    "ge": lambda ct, a, at: f"({a[0]} >= {a[1]})",
    "logical_and": lambda ct, a, at: f"({a[0]} && {a[1]})",
    "logical_or": lambda ct, a, at: f"({a[0]} || {a[1]})",
    "bitwise_and": lambda ct, a, at: f"({a[0]} & {a[1]})",
    "bitwise_or": lambda ct, a, at: f"({a[0]} | {a[1]})",
}
FLOAT_UNARY: dict[str, Expr] = {
    "neg": lambda ct, a, at: f"(-{a[0]})",
    "rsqrt": lambda ct, a, at: f"(({ct})1 / {_f(ct, 'sqrt')}({a[0]}))",
    "sqrt": lambda ct, a, at: f"{_f(ct, 'sqrt')}({a[0]})",
    "exp": lambda ct, a, at: _exp(ct, a[0]),
    "log": lambda ct, a, at: f"{_f(ct, 'log')}({a[0]})",
    "expm1": lambda ct, a, at: f"{_f(ct, 'expm1')}({a[0]})",
    "log1p": lambda ct, a, at: f"{_f(ct, 'log1p')}({a[0]})",
    "tanh": lambda ct, a, at: _tanh(ct, a[0]),
    "sigmoid": lambda ct, a, at: _sig(ct, a[0]),
    "silu": lambda ct, a, at: f"({a[0]} * {_sig(ct, a[0])})",
    "relu": lambda ct, a, at: f"({a[0]} < 0 ? ({ct})0 : {a[0]})",
    "reciprocal": lambda ct, a, at: f"(({ct})1 / {a[0]})",
    "abs": lambda ct, a, at: f"{_f(ct, 'fabs')}({a[0]})",
    "cos": lambda ct, a, at: f"{_f(ct, 'cos')}({a[0]})",
    "sin": lambda ct, a, at: f"{_f(ct, 'sin')}({a[0]})",
    "erf": lambda ct, a, at: f"{_f(ct, 'erf')}({a[0]})",
    "floor": lambda ct, a, at: f"{_f(ct, 'floor')}({a[0]})",
    "gelu": _gelu,
    "swiglu": lambda ct, a, at: f"({a[0]} * {_sig(ct, a[0])} * {a[1]})",
}
OTHER: dict[str, Expr] = {
    "where": lambda ct, a, at: f"({a[0]} ? {a[1]} : {a[2]})",
    "logical_not": lambda ct, a, at: f"(!{a[0]})",
    "bitwise_not": lambda ct, a, at: f"(!{a[0]})" if ct == "_Bool" else f"(~{a[0]})",
    "to_dtype": lambda ct, a, at: a[0],
    "clone": lambda ct, a, at: a[0],
}
ELEMENTWISE_OPS = frozenset(BINARY) | frozenset(FLOAT_UNARY) | frozenset(OTHER)
FLOAT_CT = ("float", "double")
# integer types by width: mixed in a comparison, the narrower one widens (as torch promotes;
# int8 beside uint8 promotes to int16, which is not generated)
INT_WIDTH = {"_Bool": 0, "int8_t": 1, "uint8_t": 1, "int16_t": 2, "int32_t": 3, "int64_t": 4}
BITWISE = frozenset({"bitwise_and", "bitwise_or", "bitwise_not"})


def compute_type(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    """The C type the op computes in, or None when this dtype combination is not generated."""
    op = node.op
    if op in COMPARISONS:
        cts = {r.ctype for r in ins if r.space != "scalar"}
        if cts <= {"float"}:
            return "float"
        if len(cts) == 1:
            return cts.pop()
        if cts <= set(INT_WIDTH) and not {"int8_t", "uint8_t"} <= cts:
            return max(cts, key=INT_WIDTH.get)  # torch compares in the wider integer
        return None
    if op in FLOAT_UNARY or op in ("div", "pow"):
        return out.ctype if out.ctype in FLOAT_CT else None
    if op == "logical_not":
        return "_Bool"
    if op in BITWISE:  # bool and integers only, as in torch
        return None if out.ctype in FLOAT_CT else out.ctype
    return out.ctype


def strided_map(out: Ref, ins: list[Ref], expr: Callable[[list[str]], str], ct: str,
                restrict: bool) -> str:
    """out[i] = expr(ins[i]) over the output's shape, inputs broadcast and cast to `ct`."""
    tensors = [r for r in ins if r.space != "scalar"]
    strides = [out.strides] + [broadcast_strides(out.shape, r.shape, r.strides)
                               for r in tensors]
    decl = [f"{out.ctype}* {'restrict ' if restrict else ''}o = {out.ptr(const=False)};"]
    decl += [f"const {r.ctype}* x{k} = {r.ptr()};" for k, r in enumerate(tensors)]

    def body(offs: list[str]) -> str:
        args, t = [], 1
        for r in ins:
            if r.space == "scalar":
                args.append(r.literal(ct))
            else:
                args.append(f"(({ct})x{t - 1}[{offs[t]}])")
                t += 1
        return f"    o[{offs[0]}] = ({out.ctype}){expr(args)};"

    return "\n".join(decl) + "\n" + loop_nest(out.shape, strides, body)


def element_expr(node: Node, out: Ref, ins: list[Ref]
                 ) -> tuple[str, Callable[[list[str]], str]] | None:
    """The op on one element: (compute type, args -> C expression), the args already cast to
    the compute type; None when this dtype combination is not generated. The caller casts
    the expression to `out`'s type (fuse_elementwise.py chains these in registers)."""
    ct = compute_type(node, out, ins)
    if ct is None:
        return None
    table = BINARY if node.op in BINARY else FLOAT_UNARY if node.op in FLOAT_UNARY else OTHER
    fn = table[node.op]
    return ct, lambda a: fn(ct, a, node.attrs)


def emit_elementwise(node: Node, out: Ref, ins: list[Ref], restrict: bool) -> str | None:
    e = element_expr(node, out, ins)
    if e is None:
        return None
    ct, expr = e
    return strided_map(out, ins, expr, ct, restrict)


def emit_copy(out: Ref, src: Ref) -> str:
    """A strided copy of a same-shaped view."""
    return strided_map(out, [src], lambda a: a[0], out.ctype, True)


def emit_reshape_copy(out: Ref, src: Ref) -> str:
    """`view` where torch copies: elements in row-major order of both shapes; the output is
    read as a view of the input's shape (it is contiguous, so that view exists)."""
    if out.strides != contiguous_strides(out.shape):
        raise ValueError("reshape copy into a non-contiguous buffer")
    as_in = out.with_view(src.shape, contiguous_strides(src.shape), out.offset)
    return emit_copy(as_in, src)


def emit_cat(out: Ref, ins: list[Ref], dim: int) -> str:
    dim = dim % len(out.shape)
    parts, start = [], 0
    for r in ins:
        if r.shape[dim] == 0 and len(r.shape) == 1:  # torch's legacy empty-tensor case
            continue
        off = out.offset + start * out.strides[dim]
        piece = out.with_view(r.shape, out.strides, off)
        parts.append("{\n" + emit_copy(piece, r) + "\n}")
        start += r.shape[dim]
    return "\n".join(parts)


def emit_rope(out: Ref, ins: list[Ref], restrict: bool) -> str | None:
    """rope(x, cos, sin) = x * cos + rotate_half(x) * sin over the output's shape, cos and sin
    broadcast by strides. The last dim (2h) is walked in pairs (j, j + h): both x values (and
    the cos/sin at both) are read before either output is written, so the kernel is also right
    in place of any input laid out like the output (plan.py's in-place reuse)."""
    if out.ctype not in FLOAT_CT or not out.shape or out.shape[-1] % 2:
        return None
    ct, d = out.ctype, out.shape[-1]
    h = d // 2
    x = ins[0]
    if x.space == "scalar" or x.shape[-1:] != (d,):
        return None
    bstr = [broadcast_strides(out.shape, r.shape, r.strides) if r.space != "scalar" else None
            for r in ins]
    q = "restrict " if restrict else ""
    decl = [f"{out.ctype}* {q}o = {out.ptr(const=False)};"]
    decl += [f"const {r.ctype}* x{k} = {r.ptr()};" for k, r in enumerate(ins)
             if r.space != "scalar"]
    tensors = [k for k, r in enumerate(ins) if r.space != "scalar"]
    outer = [out.strides[:-1]] + [bstr[k][:-1] for k in tensors]  # type: ignore[index]

    def body(offs: list[str]) -> str:
        base = dict(zip(tensors, offs[1:]))

        def at(k: int, j: str) -> str:
            r = ins[k]
            if r.space == "scalar":
                return r.literal(ct)
            s = bstr[k][-1]  # type: ignore[index]
            return f"(({ct})x{k}[{base[k]} + ({j})*{s}])" if s else f"(({ct})x{k}[{base[k]}])"

        so = out.strides[-1]
        # No `omp simd` / `GCC ivdep` here, though the iterations are independent: GCC 12 -O3
        # miscompiles this loop with either (two stores, at j and j + h) for some halves and
        # output layouts (StableLM's 4-wide partial rotary, heads interleaved: wrong values;
        # tests/test_rope.py). Unannotated, -O3 compiles it right.
        return (f"    for (int64_t j = 0; j < {h}; j++) {{\n"
                f"        {ct} a = {at(0, 'j')}, b = {at(0, f'j + {h}')};\n"
                f"        {ct} c0 = {at(1, 'j')}, c1 = {at(1, f'j + {h}')};\n"
                f"        {ct} s0 = {at(2, 'j')}, s1 = {at(2, f'j + {h}')};\n"
                f"        {ct} r0 = a * c0, r1 = b * c1, t0 = (-b) * s0, t1 = a * s1;\n"
                f"        o[{offs[0]} + j*{so}] = ({out.ctype})(r0 + t0);\n"
                f"        o[{offs[0]} + (j + {h})*{so}] = ({out.ctype})(r1 + t1);\n"
                f"    }}")

    numel = 1
    for n in out.shape:
        numel *= n
    return "\n".join(decl) + "\n" + loop_nest(out.shape[:-1], outer, body, work=numel,
                                              simd=False)
