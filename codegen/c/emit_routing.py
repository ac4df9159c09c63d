"""The mixture-of-experts kernels: a router's choices (`topk_values`, `topk_indices`, the
first extreme's index `argmax` / `argmin`, a mask written by `scatter_value`) and the expert
GEMM (`expert_mm`, the static library kernels/experts.c: rows grouped by expert, each chosen
expert's weight read once)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...ir import Node, dtype_of
from ...ops import operands_of
from .emit_elementwise import emit_copy
from .emit_format_gemm import quantized_panels
from .loops import PARALLEL_MIN, loop_nest
from .packed_gemm import PACKED_GEMM, PackedWeight
from .packer import pack_in_c
from .quant_gemm import QUANT_GEMM, format_library
from .static_c import StaticLibrary, calling, library_text
from .tiles import PACKED_PANEL, QUANT_PANEL
from .values import Layout, Ref

_EXPERTS_H, _EXPERTS_C = library_text("experts")
EXPERTS = StaticLibrary("experts", _EXPERTS_C, ("eq_expert_mm",), (PACKED_GEMM,), _EXPERTS_H)
_QUANT_EXPERTS_H, _QUANT_EXPERTS_C = library_text("quant_experts")
QUANT_EXPERTS = StaticLibrary("quant_experts", _QUANT_EXPERTS_C, ("eq_expert_mm_q",),
                              (EXPERTS, QUANT_GEMM), _QUANT_EXPERTS_H)
_TOPK_H, _TOPK_C = library_text("topk")
TOPK = StaticLibrary("topk", _TOPK_C, ("eq_topk",), header=_TOPK_H)
TOPK_MAX_N = 16384  # a row's (value, index) pairs live on the stack: 256 KiB at most


def emit_topk(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    """Each row's k largest (smallest) values or their indices, in torch.topk's order, ties
    included (kernels/topk.c follows its algorithms); rows of at most TOPK_MAX_N."""
    x = ins[0]
    k, dim = node.attrs["k"], node.attrs["dim"]
    rank = len(x.shape)
    if not rank or dim != rank - 1 or not 0 < k <= x.shape[-1] or \
            x.shape[-1] > TOPK_MAX_N or x.ctype not in ("float", "double"):
        return None
    field = "v" if node.op == "topk_values" else "i"
    n, xs, os_ = x.shape[-1], x.strides[-1], out.strides[-1]

    def body(offs: list[str]) -> str:
        return f"""    eq_pair q[{n}];
    for (int64_t e = 0; e < {n}; e++) {{ q[e].v = x[{offs[0]} + e * {xs}]; q[e].i = e; }}
    eq_topk(q, {n}, {k}, {int(node.attrs["largest"])});
    for (int64_t j = 0; j < {k}; j++) o[{offs[1]} + j * {os_}] = ({out.ctype})q[j].{field};"""
    return calling(f"const {x.ctype}* x = {x.ptr()};\n{out.ctype}* o = {out.ptr(const=False)};\n"
                   + loop_nest(x.shape[:-1], [x.strides[:-1], out.strides[:-1]], body,
                               work=math.prod(x.shape) * 8, simd=False), TOPK)


def emit_arg_extreme(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    """The index of the first largest (argmax) or smallest (argmin) element along dim; a NaN
    counts as the extreme, as in torch."""
    x = ins[0]
    if x.ctype not in ("float", "double") or out.ctype != "int64_t" or not x.shape:
        return None
    d = node.attrs["dim"] % len(x.shape)
    rows = x.shape[:d] + (1,) + x.shape[d + 1:]
    ost = out.strides if node.attrs["keepdim"] else out.strides[:d] + (0,) + out.strides[d:]
    better = ">" if node.op == "argmax" else "<"
    n, xs = x.shape[d], x.strides[d]

    def body(offs: list[str]) -> str:
        return f"""    {x.ctype} best = x[{offs[0]}]; int64_t at = 0;
    for (int64_t e = 1; e < {n} && best == best; e++) {{
        const {x.ctype} v = x[{offs[0]} + e * {xs}];
        if (v {better} best || v != v) {{ best = v; at = e; }}
    }}
    o[{offs[1]}] = at;"""
    return (f"const {x.ctype}* x = {x.ptr()};\nint64_t* o = {out.ptr(const=False)};\n"
            + loop_nest(rows, [x.strides, ost], body, work=math.prod(x.shape), simd=False))


def emit_scatter_value(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    """out = x with `value` where the index points along dim (torch.scatter with a number);
    an index out of range writes nothing and is an index error."""
    x, idx = ins
    if idx.ctype != "int64_t" or out.dtype != x.dtype or len(idx.shape) != len(x.shape) or \
            not x.shape:
        return None
    d = node.attrs["dim"]
    n = x.shape[d]
    value = Ref("scalar", 0, 0, (), (), "float64", node.attrs["value"]).literal(out.ctype)
    ost = out.strides[:d] + (0,) + out.strides[d + 1:]
    copy = "" if (out.root, out.offset, out.strides) == (x.root, x.offset, x.strides) \
        else emit_copy(out, x) + "\n"

    def body(offs: list[str]) -> str:
        return (f"    const int64_t q = ix[{offs[1]}];\n"
                f"    if ((uint64_t)q < {n}ULL) o[{offs[0]} + q * {out.strides[d]}] = {value};\n"
                f"    else EQ_INDEX_ERROR();")
    return (f"{{\n{copy}}}\n{{\n{out.ctype}* o = {out.ptr(const=False)};\n"
            f"const int64_t* ix = {idx.ptr()};\n"
            + loop_nest(idx.shape, [ost, idx.strides], body, simd=False) + "\n}")


@dataclass(frozen=True)
class PackedExperts:
    """A prepared constant: the experts' weights [E, K, N] (the view at `offset` of the
    constant `name`, strides es, rs, cs), each packed as PackedWeight packs a dense weight:
    [E, ceil(N / 32), K, 32]."""
    name: str
    offset: int
    e: int
    k: int
    n: int
    es: int
    rs: int
    cs: int

    def prepare(self, constants: dict[str, torch.Tensor]) -> torch.Tensor:
        w = constants[self.name]
        flat = w.detach().reshape(-1, w.shape[-1]) if w.dim() != 2 else w
        out = torch.empty(self.e, -(-self.n // PACKED_PANEL), self.k, PACKED_PANEL)
        for e in range(self.e):
            spec = PackedWeight(self.name, self.offset + e * self.es, self.k, self.n,
                                self.rs, self.cs)
            if pack_in_c(flat, spec.offset, self.k, self.n, self.rs, self.cs,
                         out=out[e]) is None:
                out[e] = spec.prepare_in_torch(w)
        return out


def emit_expert_mm(node: Node, out: Ref, ins: list[Ref], layout: Layout) -> str | None:
    """out [S, N] = rows of x [S, K] times their experts' weights, w a constant: float
    experts [E, K, N] packed per expert when the program is prepared (any strides, so
    transformers' [E, N, K] storage read transposed is packed as it lies), or stored ones
    (int8, fp8, int4 groups, bf16, fp16: [K, E N] side by side, N a whole number of
    QUANT_PANEL panels) laid out as the quantized GEMM's panels; x's rows contiguous along
    k, out's along n, float32. Otherwise the op runs in torch."""
    x, w, w_scale, ids = operands_of("expert_mm", ins)
    if not (x.dtype == out.dtype == "float32") or ids.ctype != "int64_t" or \
            len(x.shape) != 2 or len(ids.shape) != 1 or x.strides[1] != 1 or \
            out.strides[1] != 1 or ids.strides[0] != 1:
        return None
    if node.attrs["weight"] != "float":
        return _stored_experts(node.attrs["weight"], out, x, w, w_scale, ids, layout)
    name = layout.constant_name(w)
    if name is None or w.dtype != "float32" or len(w.shape) != 3:
        return None
    (S, K), (E, _, N) = x.shape, w.shape
    spec = PackedExperts(name, w.offset, E, K, N, *w.strides)
    panels = -(-N // PACKED_PANEL)
    packed = layout.prepared(spec, (E, panels, K, PACKED_PANEL), "float32")
    par = int(S * K * N >= PARALLEL_MIN * 8)
    return calling(f"""eq_expert_mm({S}, {K}, {N}, {E}, {x.ptr()}, {x.strides[0]},
             {packed.ptr()}, {panels * K * PACKED_PANEL}, {ids.ptr()},
             {out.ptr(const=False)}, {out.strides[0]}, {par});""", EXPERTS)


def _stored_experts(fmt: str, out: Ref, x: Ref, w: Ref, w_scale: Ref, ids: Ref,
                    layout: Layout) -> str | None:
    """eq_expert_mm_q on the experts' integers and scales, panelled as one weight [K, E N]
    by the quantized GEMM's QuantPanels: expert e's panels are the e-th N / QUANT_PANEL."""
    (S, K), N = x.shape, out.shape[1]
    if len(w.shape) != 2 or N % QUANT_PANEL or w.shape[1] % N:
        return None
    panels = quantized_panels(fmt, w, w_scale, w.shape[1], False, layout)
    if panels is None:
        return None
    code, group, wq, ws = panels
    experts = w.shape[1] // N

    def per_expert(r: Ref | None) -> int:  # bytes from one expert's panels to the next
        return 0 if r is None else math.prod(r.shape) * dtype_of(r.dtype).itemsize // experts

    par = int(K * N >= PARALLEL_MIN * 8)
    return calling(f"""eq_expert_mm_q({S}, {K}, {N}, {experts}, {x.ptr()}, {x.strides[0]},
               {code}, {group}, (const char*){wq.ptr()}, {per_expert(wq)},
               (const char*){ws.ptr() if ws else 'NULL'}, {per_expert(ws)}, {ids.ptr()},
               {out.ptr(const=False)}, {out.strides[0]}, {par});""", QUANT_EXPERTS,
                   format_library(code))
