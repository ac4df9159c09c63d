"""The gemm op's kernels: one emitter family, chosen by the op's descriptor (ops.py).

    float weight, no prologue     emit_matmul.emit_product: packed/BLAS/row-streaming GEMM, the
                                  residual, bias and activation in the tile epilogue
    float weight, rms_norm        emit_norm_matmul: 1/rms per row as the packed GEMM's row
                                  scale, the norm weight folded into the packed weight
    float weight, swiglu          emit_matmul_swiglu: gate and up tiles joined as stored
    quantized or sparse weight    emit_format_gemm: dequantized in registers, or its zeros
                                  skipped (any prologue, epilogue and activation)

A descriptor none of them generates (an activation after the SwiGLU, say) runs as a torch
step on the arena: correct, only slower."""

from __future__ import annotations

from ...ir import Node
from .emit_format_gemm import emit_format_gemm
from .emit_matmul import emit_product
from .emit_matmul_swiglu import emit_matmul_swiglu
from .emit_norm_matmul import emit_rms_norm_matmul
from .fuse_rope import RopeEpilogue
from .values import Layout, Ref


def emit_gemm(node: Node, out: Ref, ins: list[Ref], blas: bool, layout: Layout,
              ropes: tuple[RopeEpilogue, ...] = ()) -> str | None:
    a = node.attrs
    x, w, w_scale, norm, addend = ins
    alpha = float(a["alpha"])
    plain_epilogue = a["epilogue"] == "none" and a["act"] == "none"
    if a["weight"] != "float":
        return None if ropes else emit_format_gemm(a, out, x, w, w_scale, norm, addend,
                                                   layout)
    if a["prologue"] == "rms_norm":
        if not plain_epilogue:
            return None
        return emit_rms_norm_matmul(out, x, w, norm, float(a["eps"]), alpha, layout, ropes)
    if a["epilogue"] == "swiglu":
        if a["act"] != "none" or alpha != 1.0 or ropes or len(w.shape) != 2:
            return None
        n = int(a["n"])
        (k, _), (rs, cs) = w.shape, w.strides
        gate = w.with_view((k, n), (rs, cs), w.offset)
        up = w.with_view((k, n), (rs, cs), w.offset + n * cs)
        return emit_matmul_swiglu(out, x, gate, up, layout)
    act = None if a["act"] == "none" else a["act"]
    if a["epilogue"] == "bias":
        return emit_product(out, x, w, alpha, blas, layout, ropes, bias=addend,
                            beta=float(a["beta"]), act=act)
    return emit_product(out, x, w, alpha, blas, layout, ropes,
                        res=addend if a["epilogue"] == "add" else None, act=act)
